"""The operands of ``sparse_matmul`` (and of the layer and the Blackwell plans that share them),
checked and placed before a kernel is planned: the sparse operand's "sm90" metadata words (a tagged
buffer validated once and copied once per device, or raw words checked for shape and, on the host,
nibbles: docs/sparse-metadata.md), and values and b with their shapes and K checked and cast to the
operand type."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from ..sparsity import MetadataBuffer
from ..sparsity.dtypes import OperandType
from ..sparsity.errors import SP_META_SHAPE, SP_MISSING_SIZE, SP_OPERAND_MISMATCH
from ..sparsity.formats import metadata_shape
from ..sparsity.validate import checked_metadata
from .arrays import array_kind, as_u32_words, bad_input, cast_operand, check_real_operand, copy_like, placed_array

if TYPE_CHECKING:
    from .gemm_choice import KernelChoice

_validated: weakref.WeakKeyDictionary[MetadataBuffer, set[tuple[str, str, int]]] = weakref.WeakKeyDictionary()
"""The (format, operand type, m) each buffer was validated as: the format too, since a "tcgen05" buffer
validated by a Blackwell plan must still be refused where "sm90" words are expected."""
device_copies: weakref.WeakKeyDictionary[MetadataBuffer, dict[str, Any]] = weakref.WeakKeyDictionary()
"""A tagged buffer's uint32 "sm90" words on each device (key: the device's ``str``), copied once by
:func:`kernel_words`, or kept by :func:`~.compress_weight.prune_and_compress` from the GPU toolkit."""


def validated_metadata(meta: MetadataBuffer, fmt: str, op: OperandType, m: int, k_values: int,
                       k_b: int) -> MetadataBuffer:
    """``meta`` after validating it once per (format, operand type, m) as ``fmt`` (format, width
    class, m, nibbles) and checking that its K fits values (``k_values``) and b (``k_b``)."""
    seen = _validated.setdefault(meta, set())
    if (fmt, op.name, m) not in seen:
        checked_metadata(meta, fmt, op.name, m=m)
        seen.add((fmt, op.name, m))
    if not meta.k <= k_values < meta.k + op.group:
        raise bad_input(f"the metadata was encoded for k = {meta.k}, but values cover K = {k_values}",
                        code=SP_MISSING_SIZE, help="encode the metadata of the operand whose values are passed")
    if k_b != meta.k:
        raise bad_input(f"b has K = {k_b} columns but the sparse operand's metadata was encoded for K = {meta.k}",
                        code=SP_OPERAND_MISMATCH,
                        help=f"b is stored N x K: pass all {meta.k} columns of the weight's K (a narrower b would "
                        "silently drop the last weight columns)")
    return meta


def _tagged_metadata(meta: MetadataBuffer, op: OperandType, m: int, k_values: int, k_b: int) -> np.ndarray:
    """Validate a tagged "sm90" buffer once and check its K."""
    return validated_metadata(meta, "sm90", op, m, k_values, k_b).data


def _raw_metadata(meta: Any, op: OperandType, m: int, k_values: int, k_b: int) -> Any:
    """Check a raw word array's shape (and its nibbles when it is on the host)."""
    shape = tuple(getattr(meta, "shape", ()))
    fits = {k: metadata_shape("sm90", op, m, k) for k in (k_values, k_b)}
    if shape not in fits.values():
        want = " or ".join(sorted({str(s) for s in fits.values()}))
        raise bad_input(f"sm90 metadata of a {op.name} operand with M = {m}, K = {k_b} has shape {want}, got {shape}",
                        code=SP_META_SHAPE, help='encode it with encode_metadata(indices, "sm90", dtype)')
    if isinstance(meta, np.ndarray):
        k = next(k for k, s in fits.items() if s == shape)
        checked_metadata(np.ascontiguousarray(meta).view(np.uint32) if meta.dtype == np.int32 else meta,
                         "sm90", op.name, m, k)  # (every call: no buffer, whose constructor copies the words)
    return meta


def kernel_words(meta: Any, values: Any, op: OperandType, m: int, k_values: int, k: int, interpret: bool) -> Any:
    """The uint32 "sm90" metadata words the kernel reads, where ``values`` lives: a tagged buffer
    validated once and copied once per device, or raw words checked for shape (and nibbles on the
    host)."""
    if isinstance(meta, MetadataBuffer):
        words: Any = _tagged_metadata(meta, op, m, k_values, k)
        if array_kind(values) in ("torch", "cupy"):  # one device copy per buffer and device
            copies = device_copies.setdefault(meta, {})
            device = str(getattr(values, "device", "cupy"))
            if device not in copies:
                copies[device] = as_u32_words(copy_like(as_u32_words(words), values))
            words = copies[device]
    else:
        words = _raw_metadata(placed_array(meta, "meta", interpret), op, m, k_values, k)
    return as_u32_words(words)


def checked_operands(values: Any, b: Any, choice: KernelChoice, op: OperandType, interpret: bool,
                     cast_b: bool = True, b_name: str = "b") -> tuple[Any, Any, int, int, int, int]:
    """``values`` and ``b`` placed for the launch and cast to the operand type (``cast_b`` False:
    b keeps its own type), with their shapes checked: (values, b, M, N, K of b, K the values cover).
    Bools and complex numbers are refused (:func:`~.arrays.check_real_operand`), not cast.
    ``b_name``: what the caller calls b in its diagnostics (sparse_linear's ``x``)."""
    for what, x in (("values", values), (b_name, b)):  # (before placing: require_numeric words complex otherwise)
        check_real_operand(x, what)
    values = cast_operand(placed_array(values, "values", interpret), choice, "values")
    b = placed_array(b, b_name, interpret)
    check_real_operand(b, b_name)  # (a list of bools, placed)
    if cast_b:
        b = cast_operand(b, choice, b_name)
    for what, x in (("values", values), (b_name, b)):
        if len(x.shape) != 2:
            raise bad_input(f"{what} must be a 2-D array, got shape {tuple(x.shape)}",
                            help=f"values is (M, K/2) from compress(); {b_name} is (N, K)")
    m, half_k = (int(s) for s in values.shape)
    n, k = (int(s) for s in b.shape)
    k_values = 2 * half_k
    if not k <= k_values < k + op.group:  # compress() pads K to a whole chunk of G, never more
        raise bad_input(f"values cover K = {k_values} (shape {tuple(values.shape)}) but {b_name} has K = {k} (shape "
                        f"{tuple(b.shape)})", code=SP_OPERAND_MISMATCH,
                        help=f"{b_name} is stored N x K: pass it with the K of the weight (transposed?)")
    return values, b, m, n, k, k_values
