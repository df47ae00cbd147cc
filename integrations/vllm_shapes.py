"""The layer shapes vLLM's 2:4 scheme loads, checked when a sparse-24-bitmask checkpoint is written.

vLLM's ``CompressedTensors24`` sizes a layer's ``bitmask`` (out_features, in_features // 8) and its
``compressed`` (out_features, in_features // 2): a layer whose in_features or out_features is no
multiple of 8 does not load there, though the file is what compressed-tensors writes and reads (its
bitmask holds ceil(in_features / 8) bytes a row; docs/torch.md, "What vLLM and compressed-tensors
take"). ``save_sparse24_checkpoint`` writes such layers and warns (:class:`VLLMShapeWarning`), once
per save, naming them; and warns (:class:`VLLMLayoutWarning`) for layers made from a transformers
Conv1D, written (in, out) as transformers reads them, which vLLM's GPT-2 reads as (out, in).
Pure Python (no torch), so that pytest's configuration can name the warning classes without torch.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from .errors import attribute_path

VLLM_MULTIPLE = 8
"""in_features and out_features of a layer vLLM's 2:4 scheme loads are multiples of this."""

SHOWN = 8
"""How many of the layers the warning names (then how many more there are)."""


class VLLMShapeWarning(UserWarning):
    """A sparse-24-bitmask checkpoint was written with layers whose in_features or out_features is no
    multiple of 8: compressed-tensors and ``load_sparse24_checkpoint`` read them, vLLM does not."""


def vllm_misfits(layers: Mapping[str, Any]) -> list[str]:
    """The names of the layers of ``layers`` (name -> a layer with ``in_features`` and
    ``out_features``) that vLLM's 2:4 scheme cannot load, in the given order."""
    return [name for name, m in layers.items() if m.in_features % VLLM_MULTIPLE or m.out_features % VLLM_MULTIPLE]


def dense_in_place(name: str, layer: Any) -> str:
    """The statements that put a dense layer equal to the SparseLinear ``layer`` (``model.<name>``) in
    its place, which ``save_sparse24_checkpoint`` writes as a plain ``<name>.weight``: its
    ``to_linear()``; for a layer made from a transformers Conv1D (``transposed_from``), a Conv1D of
    that weight's transpose, written (in, out) as transformers reads it (an nn.Linear there would write
    (out, in) under the Conv1D's name, which transformers reads transposed: a square layer without an
    error)."""
    at = attribute_path("model", name)
    if getattr(layer, "transposed_from", None) is None:
        return f"{at} = {at}.to_linear()"
    return (f"linear = {at}.to_linear(); conv = Conv1D({layer.out_features}, {layer.in_features}) "
            "(transformers.pytorch_utils; Conv1D(out, in)); conv.weight.data = linear.weight.T.contiguous(); "
            f"conv.bias.data = linear.bias.data; {at} = conv")


def _dense_help(layers: Mapping[str, Any], names: list[str]) -> str:
    """How to write the layers ``names`` of ``layers`` dense: an nn.Linear in each one's place, a
    transformers Conv1D for those made from one (:func:`dense_in_place`)."""
    conv = [n for n in names if getattr(layers[n], "transposed_from", None) is not None]
    text = "write those layers dense (layer.to_linear() in their place; q/k/v and gate/up parts all together)"
    if not conv:
        return text
    shown = ", ".join(n or "(the model)" for n in conv[:SHOWN]) + (", ..." if len(conv) > SHOWN else "")
    return (f"{text}, and those made from a transformers Conv1D ({shown}) as a Conv1D, not an nn.Linear, whose "
            "weight (in, out) transformers reads under their names (an nn.Linear's (out, in) would be read "
            f"transposed): {dense_in_place(conv[0], layers[conv[0]])}")


def warn_vllm_shapes(layers: Mapping[str, Any], stacklevel: int = 3) -> None:
    """One :class:`VLLMShapeWarning` naming the layers of ``layers`` that vLLM cannot load, if any
    (``stacklevel``: the user's call of the writer, for a direct caller of this function's caller)."""
    names = vllm_misfits(layers)
    if not names:
        return
    misfits = [f"{n or '(the model)'} ({layers[n].in_features} in, {layers[n].out_features} out)" for n in names]
    more = f", and {len(misfits) - SHOWN} more" if len(misfits) > SHOWN else ""
    warnings.warn(
        f"save_sparse24_checkpoint: vLLM cannot load {len(misfits)} layer{'s' if len(misfits) != 1 else ''} of this "
        f"checkpoint: {', '.join(misfits[:SHOWN])}{more}. Its 2:4 scheme (CompressedTensors24) sizes the bitmask "
        f"(out_features, in_features // 8) and needs in_features and out_features to be multiples of 8; the "
        "checkpoint is written, and compressed-tensors and load_sparse24_checkpoint read it as it is. For vLLM, "
        f"{_dense_help(layers, names)}",
        VLLMShapeWarning, stacklevel=stacklevel)


class VLLMLayoutWarning(UserWarning):
    """A sparse-24-bitmask checkpoint was written with layers made from a transformers Conv1D, in
    GPT-2's layout (in, out), as transformers reads them: vLLM's GPT-2 transposes only the tensors
    named ``.weight``, so its 2:4 scheme would take their ``.compressed`` and ``.bitmask`` as (out, in)."""


def warn_vllm_layout(names: list[str], square: list[str], stacklevel: int = 3) -> None:
    """One :class:`VLLMLayoutWarning` naming the layers ``names`` made from a transformers Conv1D (and
    of them the ``square`` ones, which vLLM would load transposed without an error), if any."""
    if not names:
        return
    more = f", and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    shown = ", ".join(names[:SHOWN]) + more
    silent = (f"; the square ones ({', '.join(square[:SHOWN])}{', ...' if len(square) > SHOWN else ''}) would load "
              "transposed without an error" if square else "")
    warnings.warn(
        f"save_sparse24_checkpoint: vLLM cannot load {len(names)} layer{'s' if len(names) != 1 else ''} made from a "
        f"transformers Conv1D ({shown}). They are written in GPT-2's layout (in, out), as transformers and "
        "compressed-tensors read a Conv1D's weight, while vLLM's GPT-2 transposes only tensors named .weight: its "
        "2:4 scheme (CompressedTensors24) takes .compressed and .bitmask as (out, in), so a layer that is not square "
        f"fails on shape{silent}. The checkpoint is written; for vLLM, keep these layers dense (sparsify_ with a "
        "filter_fn)",
        VLLMLayoutWarning, stacklevel=stacklevel)
