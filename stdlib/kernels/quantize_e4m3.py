"""The e4m3 quantizers of x for fp8 sparse linear layers (``quantize.spk``): per token, and with a
static per-tensor scale read from device memory; the functions, and their launches prepared once
for the torch layer's eager calls (docs/torch.md)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from .arrays import array_kind, bad_input, empty_array, placed_array

E4M3_MAX = 448.0

QUANTIZE_FILE = Path(__file__).resolve().parent / "quantize.spk"


@functools.cache
def quantize_module() -> Any:
    """The loaded ``quantize.spk`` module (quantize_e4m3_per_token)."""
    from ...driver.module import load

    return load(QUANTIZE_FILE)


ONE_PASS_MAX_K = 16384
"""Rows up to this many elements are read once and kept in registers (32 per thread)."""
TWO_PASS_BLOCK = 4096
"""Elements per step of a longer row (read twice: its maximum, then its quantization)."""


def quantize_block(k: int) -> int:
    """The quantizer's BLOCK for rows of ``k`` elements: the power of two from 16 up to k when the
    row is read once (k <= ONE_PASS_MAX_K), else TWO_PASS_BLOCK."""
    if k > ONE_PASS_MAX_K:
        return TWO_PASS_BLOCK
    block = 16
    while block < k:
        block *= 2
    return block


def quantize_options(k: int) -> dict[str, int]:
    """Constexprs and launch options of the quantizer for rows of ``k`` elements: BLOCK, ONE_PASS,
    and num_warps so that each thread holds at most 32 elements of a step (4 to 16 warps): a
    4096-element row is eight 16-byte loads per thread of 4 warps, all in flight at once."""
    block = quantize_block(k)
    return {"BLOCK": block, "ONE_PASS": int(k <= ONE_PASS_MAX_K), "num_warps": min(16, max(4, block // 1024))}


def prepare_quantize_per_token_e4m3(x: Any, xq: Any, scale: Any, per_call: tuple[str, ...] = ("X", "XQ", "S"),
                                    trigger: bool = False) -> Any:
    """The launch of :func:`quantize_per_token_e4m3`'s kernel for GPU arrays x (T, K) contiguous,
    xq (T, K) e4m3 and scale (T,) f32, prepared once (``kernel[grid].prepare``): each call passes
    its own arrays named in ``per_call`` (default all three: ``launch.run((x, xq, scale), stream)``)
    of the same shapes and types, without the generic launch's binding and checks (the torch layer's
    eager e4m3 calls; ``per_call=("X",)`` keeps xq and scale as prepared). ``trigger`` (sm_90+): the
    kernel lets the next launch, a GEMM with ``pdl=True``, start at once (``pdl.launch_dependents()``)."""
    t, k = (int(s) for s in x.shape)
    kernel = quantize_module().quantize_e4m3_per_token
    return kernel[(t,)].prepare(x, xq, scale, k, k, k, **quantize_options(k), per_call=per_call,
                                **({"TRIGGER": 1} if trigger else {}))


def quantize_per_token_e4m3(x: Any, *, interpret: bool = False) -> tuple[Any, Any]:
    """(x_q, scale_x) with x ≈ x_q * scale_x[:, None]: per row t of x (T, K), scale_x[t] =
    max(amax_t / 448, 1 / (448 * 512)) (f32) and x_q = clamp(x * (1 / scale_x[t]), ±448) rounded to e4m3
    (the ``quantize_e4m3_per_token`` kernel). Arrays come back where x lives (numpy / torch)."""
    xh = placed_array(x, "x", interpret)
    if len(xh.shape) != 2:
        raise bad_input(f"x must be a 2-D (T, K) array, got shape {tuple(xh.shape)}",
                        help="reshape to (tokens, features)")
    if array_kind(xh) == "torch":
        xh = xh.contiguous()
    else:
        xh = np.ascontiguousarray(xh)
    t, k = (int(s) for s in xh.shape)
    home, on_host = (xh if array_kind(xh) != "numpy" else x), interpret or array_kind(xh) == "numpy"
    xq = empty_array(home, (t, k), "float8_e4m3fn", on_host)
    scale = empty_array(home, (t,), "float32", on_host)
    if t and k:
        kernel = quantize_module().quantize_e4m3_per_token
        (kernel.interpret[(t,)] if interpret else kernel[(t,)])(xh, xq, scale, k, k, k, **quantize_options(k))
    elif t:
        scale[...] = 1.0 / (E4M3_MAX * 512)
    if array_kind(xq) == "numpy" and array_kind(x) in ("torch", "torch-cpu"):
        from .arrays import copy_like

        return copy_like(xq, x), copy_like(scale, x)
    return xq, scale


STATIC_BLOCK_MAX = 4096
"""The static quantizer's most elements per step of a row (its rows are read once, in steps)."""


def static_options(k: int) -> dict[str, int]:
    """Constexprs and launch options of the static quantizer for rows of ``k`` elements: BLOCK the
    power of two from 16 up to k (at most :data:`STATIC_BLOCK_MAX`), num_warps as the per-token one's."""
    block = min(quantize_block(min(k, STATIC_BLOCK_MAX)), STATIC_BLOCK_MAX)
    return {"BLOCK": block, "num_warps": min(16, max(4, block // 1024))}


def prepare_quantize_static_e4m3(x: Any, xq: Any, scale: Any, per_call: tuple[str, ...] = ("X", "XQ"),
                                 trigger: bool = False) -> Any:
    """The launch of :func:`quantize_static_e4m3`'s kernel for GPU arrays x (T, K) contiguous, xq (T, K)
    e4m3 and the static scale (1,) f32, prepared once: each call passes its arrays named in
    ``per_call`` (default x and xq; the scale's memory is fixed and read by the kernel on each launch,
    so a write to it in place, or a CUDA graph's replay, takes its value then). ``trigger``: as
    :func:`prepare_quantize_per_token_e4m3`'s."""
    t, k = (int(s) for s in x.shape)
    kernel = quantize_module().quantize_e4m3_static
    return kernel[(t,)].prepare(x, xq, scale, k, k, k, **static_options(k), per_call=per_call,
                                **({"TRIGGER": 1} if trigger else {}))


def quantize_static_e4m3(x: Any, scale: Any, *, interpret: bool = False) -> Any:
    """x_q (T, K) e4m3 of x (T, K) with the static per-tensor ``scale`` (1,) f32: clamp(x * (1 / scale),
    ±448) rounded to nearest even, NaN kept (the ``quantize_e4m3_static`` kernel; bit for bit torch's
    ``(x * torch.reciprocal(scale)).clamp(-448, 448).to(torch.float8_e4m3fn)``). Arrays come back where
    x lives (numpy / torch)."""
    xh = placed_array(x, "x", interpret)
    sh = placed_array(scale, "scale", interpret)
    if len(xh.shape) != 2 or tuple(sh.shape) != (1,):
        raise bad_input(f"x must be a 2-D (T, K) array and scale a (1,) array, got shapes {tuple(xh.shape)} and "
                        f"{tuple(sh.shape)}", help="reshape x to (tokens, features); pass one scale")
    xh = xh.contiguous() if array_kind(xh) == "torch" else np.ascontiguousarray(xh)
    t, k = (int(s) for s in xh.shape)
    home, on_host = (xh if array_kind(xh) != "numpy" else x), interpret or array_kind(xh) == "numpy"
    xq = empty_array(home, (t, k), "float8_e4m3fn", on_host)
    if t and k:
        kernel = quantize_module().quantize_e4m3_static
        (kernel.interpret[(t,)] if interpret else kernel[(t,)])(xh, xq, sh, k, k, k, **static_options(k))
    if array_kind(xq) == "numpy" and array_kind(x) in ("torch", "torch-cpu"):
        from .arrays import copy_like

        return copy_like(xq, x)
    return xq
