"""The argument checks of ``sparse_linear`` (stdlib/kernels/linear.py): its SparsityError codes,
the activations and output types it has, and the checks of a bias or scale vector and of the x
that e4m3 weights take (e4m3 with its scale, or a 16-bit x that the decode kernel quantizes itself)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..sparsity import SparsityError
from .arrays import array_kind, placed_array

SP_LINEAR_OPTION = "SP0850"
"""An activation or output dtype sparse_linear does not have."""
SP_LINEAR_VECTOR = "SP0851"
"""A bias or scale of the wrong shape or element type."""
SP_LINEAR_FP8_INPUT = "SP0852"
"""e4m3 weights with activations of another type (they need a scale: quantize them), or with 16-bit
activations and a scale_x (the decode kernel quantizes those itself)."""
SP_LINEAR_REBIND = "SP0853"
"""SparseLinearPlan.rebind to an x or out of another shape or dtype."""

E4M3_X_DTYPES = ("float8_e4m3fn", "float8_e4m3")
X16_DTYPES = ("float16", "bfloat16")
"""x dtypes that the decode kernel quantizes to e4m3 itself, for e4m3 weights (``sparse_decode_e4m3_qx``)."""
TILED_ACTIVATIONS = ("none", "relu", "silu", "gelu_tanh")
"""The activations every sparse_linear kernel's epilogue applies (the tiled kernels', Blackwell's)."""
GATED_ACTIVATIONS = {"swiglu": "silu", "geglu": "gelu_tanh"}
"""The gated activations, each with its gate's activation: they pair the weight's rows, gate rows
0..F-1 and up rows F..2F-1, into y[t, f] = act(gate) * up, F outputs ("swiglu": Llama's SiLU gate;
"geglu": Gemma's tanh-approximated GELU gate). The decode kernel only: :func:`glu_features`."""
ACTIVATIONS = (*TILED_ACTIVATIONS, *GATED_ACTIVATIONS)
"""The epilogue's activations."""
OUT_DTYPES = {"float16": "float16", "f16": "float16", "half": "float16", "bfloat16": "bfloat16",
              "bf16": "bfloat16", "float32": "float32", "f32": "float32", "float": "float32"}


def linear_error(code: str, message: str, help: str) -> SparsityError:
    """A SparsityError of sparse_linear's arguments (its ``code``, ``message`` and ``help``)."""
    return SparsityError(code, message, help=help)


def linear_out_dtype(out_dtype: Any, x: Any) -> str:
    """The numpy name of y's element type: ``out_dtype``, else x's (f16/bf16/f32), else bfloat16."""
    if out_dtype is None:  # (a numpy x's name: that of a byte-swapped one, dtype('>f2'), too)
        name = x.dtype.name if isinstance(x, np.ndarray) else str(getattr(x, "dtype", "")).removeprefix("torch.")
        return name if name in ("float16", "bfloat16", "float32") else "bfloat16"
    try:
        spelled = str(np.dtype(out_dtype) if isinstance(out_dtype, type) else out_dtype)
    except TypeError:
        spelled = str(out_dtype)
    name = OUT_DTYPES.get(spelled.removeprefix("torch."))
    if name is None:
        raise linear_error(SP_LINEAR_OPTION, f"sparse_linear has no {spelled} output",
                           "out_dtype is float16, bfloat16 or float32")
    return name


def activation_name(activation: str | None, allowed: tuple[str, ...] = ACTIVATIONS) -> str:
    """The epilogue's activation: ``activation`` checked against ``allowed`` (SP0850), "none" for
    None. A caller that only runs the tiled kernels passes :data:`TILED_ACTIVATIONS`."""
    if activation is None:
        return "none"
    if is_gated(activation) and activation not in allowed:
        raise linear_error(SP_LINEAR_OPTION, f"activation {activation!r} is fused by the decode kernel only, which "
                           "this call does not run", f"pass activation=None and compute "
                           f"{GATED_ACTIVATIONS[activation]}(y[:, :F]) * y[:, F:] of the (T, 2F) result")
    if activation not in allowed:
        raise linear_error(SP_LINEAR_OPTION, f"unknown activation {activation!r}",
                           "activation is " + ", ".join(["None", *map(repr, allowed[1:-1])]) + f" or {allowed[-1]!r}")
    return activation


def bias_or_scale(v: Any, what: str, size: int, home: Any, interpret: bool, dtypes: tuple[str, ...]) -> tuple[Any, int]:
    """(array, mode) of a bias or scale: mode 0 for None, 1 for one value (a Python number, a 0-d or
    one-element array), 2 for ``size`` values (shape (size,) or (size, 1)). The array is a
    contiguous 1-D array of one of ``dtypes`` (else cast to the first) where the kernel reads it."""
    if v is None:
        return None, 0
    number = isinstance(v, (int, float)) and not isinstance(v, bool)
    shape = (1,) if number else tuple(int(s) for s in getattr(v, "shape", (-1,)))
    got = "a number" if number else f"shape {shape}" if shape != (-1,) else f"a {type(v).__name__}"
    if what == "bias" and shape != (size,):
        raise linear_error(SP_LINEAR_VECTOR, f"bias must have shape ({size},), got {got}",
                           "pass one bias value per output feature")
    if number:
        v = np.array([v], np.float32)
    if shape in ((), (1,), (1, 1)):
        mode = 1
    elif shape in ((size,), (size, 1)):
        mode = 2
    else:
        raise linear_error(SP_LINEAR_VECTOR, f"{what} must be a number or of shape ({size},), got {got}",
                           f"pass one value, or one per {'output feature' if what != 'scale_x' else 'token'}")
    if not interpret and array_kind(v) == "torch" and array_kind(home) == "torch":
        import torch

        if not v.is_floating_point():
            raise linear_error(SP_LINEAR_VECTOR, f"{what} must be floating point, got {v.dtype}",
                               f"pass {what} as {' or '.join(dtypes)}")
        # (a neg view, torch._neg_view(v): its memory holds the values before the negation, which the
        # kernel reads by address; resolve_neg() is a copy with it applied, v itself otherwise)
        v = v.resolve_neg().reshape(-1).to(home.device)
        if str(v.dtype).removeprefix("torch.") not in dtypes:
            v = v.to(getattr(torch, dtypes[0]))
        return v.contiguous(), mode
    host = placed_array(v, what, interpret)
    if array_kind(host) == "numpy":
        if host.dtype.kind not in "fV" and not str(host.dtype).startswith(("bfloat", "float8")):
            raise linear_error(SP_LINEAR_VECTOR, f"{what} must be floating point, got {host.dtype}",
                               f"pass {what} as {' or '.join(dtypes)}")
        host = np.ascontiguousarray(host.reshape(-1))
        if host.dtype.name not in dtypes:
            host = host.astype(np.float32)
        if not interpret and array_kind(home) in ("torch", "cupy"):
            from .arrays import copy_like

            return copy_like(host, home), mode
        return host, mode
    return host.reshape(-1), mode  # (placed_array's: a torch neg view resolved)


def check_e4m3_x(x_dtype: str, scale_x: Any, quantized_in_kernel: bool) -> None:
    """x of e4m3 weights: e4m3 (with its scale_x), or 16-bit without scale_x where the decode
    kernel quantizes it (``quantized_in_kernel``); SP0852 otherwise."""
    if x_dtype in E4M3_X_DTYPES:
        return
    if x_dtype in X16_DTYPES and scale_x is not None and quantized_in_kernel:
        raise linear_error(SP_LINEAR_FP8_INPUT, f"scale_x is the scale of e4m3 activations: e4m3 weights with x of "
                           f"{x_dtype} take none", "pass the 16-bit x alone (the decode kernel quantizes it per "
                           "token), or quantize_per_token_e4m3(x) and its scale as scale_x")
    if x_dtype in X16_DTYPES and scale_x is not None:  # a path without the quantizing kernel: quantize first
        raise linear_error(SP_LINEAR_FP8_INPUT, f"e4m3 weights need e4m3 activations, got x of {x_dtype} with a "
                           "scale_x", "quantize x with quantize_per_token_e4m3(x) and pass the e4m3 x with its "
                           "scale as scale_x (only the decode kernel, T <= 64 on sm_90a, quantizes a 16-bit x "
                           "itself, and takes no scale_x then)")
    if not (quantized_in_kernel and x_dtype in X16_DTYPES):
        raise linear_error(SP_LINEAR_FP8_INPUT, f"e4m3 weights need e4m3 activations, got x of {x_dtype}",
                           "quantize x with quantize_per_token_e4m3(x) and pass its scale as scale_x (the decode "
                           "kernel quantizes a 16-bit x itself for T <= 64 on sm_90a)")


def is_gated(activation: Any) -> bool:
    """``activation`` pairs gate and up rows (:data:`GATED_ACTIVATIONS`). Anything but a string is
    not (a dict lookup of a list or a dict would raise TypeError: unknown, SP0850, for
    :func:`activation_name`)."""
    return isinstance(activation, str) and activation in GATED_ACTIVATIONS


def glu_features(rows: int, activation: str) -> int:
    """The outputs of a gated ``activation`` over a weight of ``rows`` rows (gate half, then up half):
    rows / 2, each half a whole number of the "sm90" metadata's 16-row blocks (docs/sparse-metadata.md
    §4), so that a half's words are rows of the weight's words (SP0850 otherwise)."""
    if rows % 32:
        raise linear_error(SP_LINEAR_OPTION, f"activation {activation!r} pairs a gate half and an up half of the "
                           f"weight's rows, each a multiple of 16: got {rows} rows",
                           "concatenate [gate; up] weights whose out_features are multiples of 16 (pad with zero rows)")
    return rows // 2
