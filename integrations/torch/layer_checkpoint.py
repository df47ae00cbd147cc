"""The layer ``load_sparse24_checkpoint`` builds from a sparse-24-bitmask checkpoint's sparse layer.

:func:`sparse_layer` decodes a layer's ``compressed`` values through its ``bitmask`` (in a
transformers Conv1D's layout (in, out) where the model's module is stored so: conv1d_checkpoint.py)
into a ``SparseLinear``, or with ``trainable`` a ``SemiSparseLinear`` (trainable_checkpoint.py), in
place of the model's module: F32 / F64 values narrowed to the layer's 16-bit type, fp8 values with
their per-channel ``weight_scale`` and static ``input_scale``, weight-only fp8 (W8A16) values
dequantized as compressed-tensors does. :func:`module_classes` and :func:`linear_layers` give the
class names compressed-tensors and vLLM match a config group's targets against (the loader and the
writer, save_checkpoint.py, check vLLM's matching on them).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import torch
from torch import nn

from ...stdlib.sparsity import compress
from ..errors import SP_CHECKPOINT_LAYER, IntegrationError
from ..sparse24 import (
    LINEAR_CLASSES,
    asymmetric_group,
    checked_shape,
    declared_weight_types,
    dense_from_bitmask,
    dynamic_input_group,
    mask_from_bitmask,
    static_input_group,
    weight_only_group,
)
from .conv1d import CONV1D_ORIGIN, is_conv1d
from .conv1d_checkpoint import conv1d_layout
from .linear import SparseLinear
from .sparsify import class_names
from .trainable_checkpoint import trainable_layer
from .training import SemiSparseLinear


def _device_of(module: nn.Module) -> torch.device:
    tensor = module.values if isinstance(module, SparseLinear) else module.weight
    return torch.device("cpu") if tensor.device.type == "meta" else tensor.device


def model_type(module: nn.Module) -> np.dtype | None:
    """The 16-bit type of the model's ``module`` (an nn.Linear's or Conv1D's weight, a SparseLinear's or
    SemiSparseLinear's values: its compute type) where it is bf16 or f16, else None (float32, e4m3)."""
    weight = module.values if isinstance(module, SparseLinear | SemiSparseLinear) else module.weight
    return {torch.float16: np.dtype(np.float16), torch.bfloat16: np.dtype(ml_dtypes.bfloat16)}.get(weight.dtype)


def _layer_dtype(module: nn.Module) -> np.dtype:
    """The 16-bit type the checkpoint's values of another type (F32, F64; bf16 or f16 where the model's
    is the other) are converted to: the model module's type where it is bf16 or f16 (:func:`model_type`),
    else bf16 (sparsile's default), as compressed-tensors' decompressor leaves the stored type and
    loading copies it into the model's parameter (nn.Linear's load_state_dict: a cast, rounded to
    nearest even)."""
    want = model_type(module)
    return np.dtype(ml_dtypes.bfloat16) if want is None else want


def _narrowed(compressed: np.ndarray, name: str, module: nn.Module) -> np.ndarray:
    """``compressed`` values in the layer's 16-bit type (:func:`_layer_dtype`); SP0913 where
    that type would make finite values inf (f16 beyond ±65504; bf16 beyond its range too, which
    F64 values and the largest F32 ones exceed: before, refused in f16's words)."""
    want = _layer_dtype(module)
    with np.errstate(over="ignore"):
        narrowed = compressed.astype(want)
    big = int((np.isinf(narrowed) & np.isfinite(compressed)).sum())
    if big:
        f16 = want == np.float16
        kind = "f16" if f16 else "bf16"
        help = ("build the model in bf16 (torch_dtype=torch.bfloat16): the values are converted to the model's "
                "dtype, and bf16 keeps float32's range" if f16 else
                "scale the layer's weights into the bf16 range before writing them")
        raise IntegrationError(SP_CHECKPOINT_LAYER, f"layer {name}: the compressed values are {compressed.dtype}, "
                               f"{big} of them beyond ±{float(ml_dtypes.finfo(want).max):g}: as the model's {kind} "
                               "they would be inf", help=help)
    return narrowed


ZERO_POINTS = ("weight_zero_point", "input_zero_point")
"""The tensors of an 8-bit layer's asymmetric quantization (``<name>.weight_zero_point``, ...)."""

_ASYMMETRIC_HELP = ("quantize the layer symmetrically (compressed-tensors' default, symmetric: true; no zero point or "
                    "an all-zero one), or store its weights dequantized in bf16 / f16; strict=False does not skip it")


def _check_symmetric(tensors: dict[str, np.ndarray], name: str, config: dict[str, Any], module: nn.Module) -> None:
    """SP0913 for an 8-bit layer ``name`` quantized asymmetrically ((q - zero_point) * scale), which
    the fp8 kernel does not compute (it takes q * scale): a ``weight_zero_point`` or
    ``input_zero_point`` holding a nonzero value, or a config group that declares ``symmetric: false``
    for the layer's weights or inputs. All-zero zero points (compressed-tensors registers them for
    symmetric schemes too) are accepted. Before, the zero point was reported unexpected and, with
    ``strict=False``, dropped: the layer loaded other numbers than the checkpoint's."""
    for part in ZERO_POINTS:
        stored = tensors.get(f"{name}.{part}")
        if stored is None:
            continue
        with np.errstate(invalid="ignore"):
            nonzero = int((np.asarray(stored).astype(np.float64) != 0).sum())
        if nonzero:
            raise IntegrationError(SP_CHECKPOINT_LAYER, f"layer {name}: {name}.{part} holds {nonzero} nonzero "
                                   f"value{'s' if nonzero > 1 else ''}: asymmetric quantization ((q - zero_point) * "
                                   "scale), which the fp8 kernel does not compute (it would load q * scale)",
                                   help=_ASYMMETRIC_HELP)
    found = asymmetric_group(config, name, module_classes(module))
    if found is not None:
        group, part = found
        what = "weights" if part == "weights" else "input activations"
        raise IntegrationError(SP_CHECKPOINT_LAYER, f"layer {name}: config.json declares asymmetric {what} for it "
                               f"(config group {group!r}: {part} symmetric false, (q - zero_point) * scale), which "
                               "the fp8 kernel does not compute (it quantizes symmetrically: q * scale)",
                               help=_ASYMMETRIC_HELP)


def module_classes(module: nn.Module) -> tuple[str, ...]:
    """The class names compressed-tensors matches a class target against for the model's layer
    ``module``: those of its class's MRO that are modules (a subclass of nn.Linear of the producer's
    model: its own name, then ``Linear``, ``Module``; a transformers ``Conv1D``: ``Conv1D``,
    ``Module``); a SparseLinear or SemiSparseLinear stands where the producer had the module it
    replaced: that module's classes (``source_classes``, which ``sparsify_`` and the loader keep),
    else an nn.Linear's (:data:`~sparsile.integrations.sparse24.LINEAR_CLASSES`). Before, a layer
    made from a ``FalconLinear`` or a ``Conv1D`` was matched as an nn.Linear: a group targeting
    ``FalconLinear`` missed it in a sparsified model, and ``Linear`` claimed a sparsified GPT-2's
    projections, which it does not name in the dense model compressed-tensors reads."""
    if isinstance(module, SparseLinear | SemiSparseLinear):
        return module.source_classes or LINEAR_CLASSES
    return class_names(module)


def linear_layers(model: nn.Module, sparse: set[str]) -> dict[str, tuple[tuple[str, ...], bool]]:
    """name -> (its classes, whether it is in ``sparse``) of every linear layer (nn.Linear,
    SparseLinear, SemiSparseLinear, a transformers Conv1D: vLLM builds GPT-2's as its linear classes)
    of ``model``, under each of its names: what vLLM's matching is checked on."""
    return {name: (module_classes(m), name in sparse) for name, m in model.named_modules(remove_duplicate=False)
            if name and (isinstance(m, nn.Linear | SparseLinear | SemiSparseLinear) or is_conv1d(m))}


def _input_scale(tensors: dict[str, np.ndarray], name: str, config: dict[str, Any],
                 classes: tuple[str, ...]) -> np.ndarray | None:
    """The static per-tensor activation scale ``<name>.input_scale`` of an fp8 layer (compressed-tensors'
    ``input_activations: {dynamic: false, strategy: tensor}``), as one float32, or None; SP0913 for
    one of several elements, or not a positive finite number, and for none where config.json declares
    the layer's input activations static (x would be quantized per token instead, unseen). Where the
    group compressed-tensors applies declares them dynamic, a stored input_scale is none of the layer's
    (compressed-tensors registers none for a dynamic scheme, nor does vLLM): None, the tensor left to
    load_state_dict (unexpected)."""
    scale = tensors.get(f"{name}.input_scale")
    if scale is not None and dynamic_input_group(config, name, classes) is not None:
        return None
    if scale is None:
        static = static_input_group(config, name, classes)
        if static is not None:
            group, said = static
            how = "dynamic false" if said else "without dynamic, which compressed-tensors takes as false"
            raise IntegrationError(SP_CHECKPOINT_LAYER, f"layer {name}: config.json declares static input "
                                   f"activations for it (config group {group!r}: input_activations {how}), "
                                   f"but the checkpoint has no {name}.input_scale; x would be quantized per token "
                                   "instead of with the calibrated scale",
                                   help=f"write {name}.input_scale (x's calibrated amax / 448, one float32), or "
                                        f"declare dynamic: true for {name}'s input_activations (per-token scales)")
        return None
    scale = np.asarray(scale).astype(np.float32).reshape(-1)
    if scale.size != 1:
        raise IntegrationError(SP_CHECKPOINT_LAYER, f"layer {name}: input_scale has {scale.size} elements; a static "
                               "input scale is per tensor (one element)",
                               help="sparsile reads input activations of strategy 'tensor' (one scale) or dynamic "
                                    f"per-token ones (no {name}.input_scale)")
    if not (np.isfinite(scale[0]) and scale[0] > 0):
        raise IntegrationError(SP_CHECKPOINT_LAYER, f"layer {name}: input_scale is {float(scale[0])!r}; a static "
                               "input scale is a positive finite number",
                               help=f"write {name}.input_scale as x's calibrated amax / 448, or leave it out to "
                                    "quantize x per token")
    return scale


def _check_scale_size(scale: np.ndarray, rows: int, name: str) -> None:
    """SP0913 unless ``scale`` (a weight_scale) holds one value, or one per output channel (``rows``)
    as (rows, 1) or (rows,): a group or block strategy's scales ((rows, in / group), (ceil(rows /
    b0), ceil(in / b1))) may number ``rows`` too, and were read as one per output channel."""
    if scale.size not in (1, rows):
        raise IntegrationError(SP_CHECKPOINT_LAYER, f"layer {name}: weight_scale has {scale.size} elements for "
                               f"{rows} output channels", help="one scale per output channel")
    if scale.size > 1 and scale.shape not in ((rows,), (rows, 1)):
        raise IntegrationError(SP_CHECKPOINT_LAYER, f"layer {name}: weight_scale has shape {tuple(scale.shape)}; a "
                               f"weight scale is per output channel, ({rows}, 1) or ({rows},), or per tensor, one "
                               "element", help="sparsile reads fp8 weight scales of strategy 'channel' or 'tensor', "
                                               "not 'group' or 'block'")


def _dequantized(dense: np.ndarray, scale: np.ndarray, name: str, module: nn.Module) -> np.ndarray:
    """The 16-bit weight W_q * s_w of a weight-only fp8 layer (W8A16), as compressed-tensors'
    decompression makes it: the product in the scale's type (bf16 or f16: rounded once; float32:
    float32's product), then the layer's 16-bit type (:func:`_layer_dtype`)."""
    _check_scale_size(scale, dense.shape[0], name)
    wide = np.result_type(np.float32, scale.dtype)
    product = dense.astype(wide) * scale.reshape(-1, 1).astype(wide)
    if scale.dtype.itemsize == 2:  # (exact in float32: at most 4 + 11 significant bits; one rounding)
        with np.errstate(over="ignore"):
            rounded = product.astype(scale.dtype)
        big = int((np.isinf(rounded) & np.isfinite(product)).sum())
        if big:  # (f16 scales: the product beyond f16's range, inf in compressed-tensors' decompression too)
            raise IntegrationError(SP_CHECKPOINT_LAYER, f"layer {name}: W_q * weight_scale (its weight-only fp8 "
                                   f"values dequantized in the scale's {scale.dtype}) is beyond ±65504 for {big} "
                                   "weights: they would be inf",
                                   help="store the weight_scale in bfloat16 or float32 (the product is taken in the "
                                        "scale's type)")
        product = rounded.astype(np.float32)
    want = _layer_dtype(module)
    return product.astype(want) if product.dtype == want else _narrowed(product, name, module)


def sparse_layer(tensors: dict[str, np.ndarray], name: str, prefix: str, module: nn.Module,
                  config: dict[str, Any], trainable: bool = False) -> SparseLinear | SemiSparseLinear:
    """The layer of the checkpoint's ``name`` (tensors under ``prefix``) in place of the model's
    ``module``: a SparseLinear, or with ``trainable`` a SemiSparseLinear whose mask is the
    checkpoint's (trainable_checkpoint.py); either keeps the module's classes (``source_classes``)
    and, for a Conv1D layout, ``transposed_from``."""
    compressed = tensors[f"{prefix}.compressed"]
    columns = conv1d_layout(module)  # (a transformers Conv1D's weight W (in, out): its groups down the columns)
    if columns and np.asarray(compressed).dtype.itemsize == 1:
        raise IntegrationError(SP_CHECKPOINT_LAYER, f"layer {name}: 8-bit compressed values for a layer stored in a "
                               "transformers Conv1D's layout (in, out): a per-channel weight_scale of that weight "
                               "scales its inputs, which the fp8 kernel's scale (per output) cannot",
                               help="load a checkpoint of bf16 or f16 weights for a Conv1D layer")
    wide = None  # (values converted: a trainable layer's master weight keeps them where its type holds them)
    want = model_type(module)
    if compressed.dtype in (np.float32, np.float64) or (
            compressed.dtype in (np.float16, ml_dtypes.bfloat16) and want is not None and compressed.dtype != want):
        # (as compressed-tensors' loading: the stored type decompressed, then cast into the model's parameter; f16
        # values in a bf16 model kept f16, x cast to it: activations beyond ±65504 became inf without a word)
        wide, compressed = compressed, _narrowed(compressed, name, module)
    scale = tensors.get(f"{name}.weight_scale")
    if compressed.dtype == np.int8:
        if "int" in declared_weight_types(config):  # (compressed-tensors' int-quantized weights: int8 numbers)
            raise IntegrationError(SP_CHECKPOINT_LAYER, f"layer {name}: the compressed values are int8 and "
                                   "config.json declares int weights (type 'int' in config_groups): int8-quantized "
                                   "weights have no 2:4 kernel here (read as fp8 bits they would be other numbers)",
                                   help="load a checkpoint of bf16, f16 or fp8 (type 'float') weights")
        if scale is None:
            raise IntegrationError(SP_CHECKPOINT_LAYER, f"layer {name}: int8 compressed values without "
                                   f"{name}.weight_scale (int8 weights have no kernel here)",
                                   help="fp8 layers store their per-channel weight_scale next to the weight")
        compressed = compressed.view(ml_dtypes.float8_e4m3fn)
    if compressed.dtype.name not in ("bfloat16", "float16", "float8_e4m3fn"):
        raise IntegrationError(SP_CHECKPOINT_LAYER, f"layer {name}: compressed values of {compressed.dtype} have no "
                               "2:4 kernel", help="store bf16, f16 or fp8 (e4m3: F8_E4M3) weights")
    if compressed.dtype == ml_dtypes.float8_e4m3fn:  # (before the weight-only dequantization: W_q * s_w too)
        _check_symmetric(tensors, name, config, module)
    dense = dense_from_bitmask(compressed, tensors[f"{prefix}.bitmask"], tensors[f"{prefix}.shape"], name, columns)
    if columns:  # (the layer's weight is W.T (out, in), compressed along K)
        dense = np.ascontiguousarray(dense.T)
    if dense.dtype == ml_dtypes.float8_e4m3fn and scale is not None \
            and weight_only_group(config, name, module_classes(module)) is not None:
        dense, scale = _dequantized(dense, np.asarray(scale), name, module), None
    bias = tensors.get(f"{name}.bias")
    if scale is not None:
        scale = np.asarray(scale).astype(np.float32)
        _check_scale_size(scale, dense.shape[0], name)
        scale = np.broadcast_to(scale.reshape(-1), (dense.shape[0],)).copy()
    if bias is not None and np.size(bias) != dense.shape[0]:
        raise IntegrationError(SP_CHECKPOINT_LAYER, f"layer {name}: bias has {np.size(bias)} elements for "
                               f"{dense.shape[0]} output channels", help="one bias per output channel")
    bias_t = None if bias is None else torch.from_numpy(np.asarray(bias).astype(np.float32))
    classes = module_classes(module)
    if trainable:
        kept = mask_from_bitmask(tensors[f"{prefix}.bitmask"], checked_shape(tensors[f"{prefix}.shape"], name), name,
                                 columns)
        if wide is not None:
            wide = dense_from_bitmask(wide, tensors[f"{prefix}.bitmask"], tensors[f"{prefix}.shape"], name, columns)
            wide = np.ascontiguousarray(wide.T) if columns else wide
        layer = trainable_layer(dense, kept.T if columns else kept, bias_t, module, name, _device_of(module), wide)
    else:
        layer = _inference_layer(tensors, name, module, config, dense, scale, bias_t)
    if columns:  # (written again in the Conv1D's layout)
        layer.transposed_from = getattr(module, "transposed_from", None) or CONV1D_ORIGIN
    if classes != LINEAR_CLASSES:  # (a config group's class targets match it as they match the module it replaces)
        layer.source_classes = classes
    return layer


def _inference_layer(tensors: dict[str, np.ndarray], name: str, module: nn.Module, config: dict[str, Any],
                     dense: np.ndarray, scale: np.ndarray | None, bias_t: torch.Tensor | None) -> SparseLinear:
    """The SparseLinear of the checkpoint's layer ``name`` (its weight ``dense``; fp8 with ``scale``)
    in place of the model's ``module``."""
    values, indices = compress(dense, str(dense.dtype))
    # a SparseLinear of the model keeps its fused activation and output type (not weights: not in the file)
    options = {"activation": module.activation, "out_dtype": module.out_dtype} if isinstance(module, SparseLinear) \
        else {}
    # (a weight_scale next to 16-bit values is no scale of the layer: left to load_state_dict, unexpected)
    fp8 = dense.dtype == ml_dtypes.float8_e4m3fn  # (not a weight-only fp8 layer: dequantized above)
    # (an input_scale next to 16-bit values, too, is left to load_state_dict: unexpected)
    layer = SparseLinear.from_compressed(values, indices, dense.shape[1], bias=bias_t,
                                         scale_w=scale if fp8 else None,
                                         input_scale=_input_scale(tensors, name, config, module_classes(module))
                                         if fp8 else None,
                                         device=_device_of(module), **options)
    return layer
