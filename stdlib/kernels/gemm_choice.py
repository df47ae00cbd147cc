"""The Hopper sparse GEMM's kernels per operand type, and the choice of one for a call.

:class:`KernelChoice` describes the kernel of ``sparse_gemm_sm90.spk`` for one operand type (its
name, element size, C's element type, widest N tile, K step) and :data:`KERNELS` lists them.
:func:`resolve_kernel_choice` picks one from ``dtype=``, a MetadataBuffer's tag or the values'
element type (:func:`operand_of`), and :func:`checked_out_dtype` checks C's element type
(``out_dtype=``); what they refuse is a SparsityError SP0804. Used by ``sparse_matmul``
(:mod:`.gemm`), ``sparse_linear`` (:mod:`.linear`), the Blackwell path (:mod:`.gemm_sm100`) and the
tuners.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..sparsity import MetadataBuffer
from ..sparsity.dtypes import operand_type
from ..sparsity.errors import SP_BAD_INPUT, SP_META_ELEMENT_TYPE
from .arrays import array_kind, bad_input


@dataclass(frozen=True)
class KernelChoice:
    """The kernel of ``sparse_gemm_sm90.spk`` for one operand type, and what it needs."""

    operand: str       # toolkit operand name (f16, bf16, e4m3, s8, tf32)
    kernel: str        # kernel name in the .spk file
    elem_bytes: int    # bytes per operand element
    out_dtype: str     # numpy name of C's element type (the kernel's store type)
    torch_dtype: str   # the torch dtype attribute of the operand
    max_bn: int        # widest N tile (accumulator registers: 256 f32 columns per 2 warpgroups; tf32 128)
    block_k: int = 64               # K elements per pipeline step (the kernel's default BK)
    partial_dtype: str = "float32"  # numpy name of the split-K workspace element type

    @property
    def k_align(self) -> int:
        """K multiple that makes both TMA row lengths, K/2 values and K b elements, 16-byte multiples."""
        return 32 // self.elem_bytes

    def block_n(self, n: int) -> int:
        """BN as benchmarks/bench_sparse_gemm.py picks it: the next power of two of N, 16..max_bn."""
        bn = 16
        while bn < min(n, self.max_bn):
            bn *= 2
        return bn


KERNELS: dict[str, KernelChoice] = {c.operand: c for c in (
    KernelChoice("f16", "sparse_gemm_f16", 2, "float16", "float16", 256, 64, "float32"),
    KernelChoice("bf16", "sparse_gemm_bf16", 2, "float16", "bfloat16", 256, 64, "float32"),
    KernelChoice("e4m3", "sparse_gemm_e4m3", 1, "float16", "float8_e4m3fn", 256, 128, "float32"),
    KernelChoice("s8", "sparse_gemm_s8", 1, "int32", "int8", 256, 128, "int32"),
    KernelChoice("tf32", "sparse_gemm_tf32", 4, "float32", "float32", 128, 32, "float32"),
)}
"""Operand types with a Hopper kernel, all run on the H200 (benchmarks/RESULTS.md,
benchmarks/sweep_sparse_gemm.py)."""

_TORCH_OPERANDS = {f"torch.{c.torch_dtype}": c.operand for c in KERNELS.values()}


def operand_of(x: Any) -> str | None:
    """The operand type an array's element type names, or None."""
    if array_kind(x) in ("torch", "torch-cpu"):
        return _TORCH_OPERANDS.get(str(x.dtype))
    try:
        dt = np.dtype(x.dtype)
    except (AttributeError, TypeError):
        return None
    dt = dt.newbyteorder("=")  # (byte-swapped values are converted: as_host_array)
    return next((c.operand for c in KERNELS.values() if operand_type(c.operand).host_dtype == dt), None)


NARROW_OPERANDS = ("f16", "bf16", "e4m3", "s8")
"""Operand types whose values are never cast to a MetadataBuffer's other tag (:func:`resolve_kernel_choice`)."""


def check_operand_order(values: Any, meta: Any, b: Any, call: str, b_name: str) -> None:
    """SP0804 where the arguments of ``call(values, meta, b)`` (sparse_matmul, sparse_linear) are in
    another order: the metadata as values or as b, or numbers as the metadata (docs/sparse-metadata.md:
    a MetadataBuffer or its integer words). Otherwise each was refused by a later check that named
    the wrong cause (a K that differs, an operand type with no kernel)."""
    def refuse(message: str, code: str = SP_BAD_INPUT) -> None:
        raise bad_input(f"{call}: {message}", help=f"pass {call}(weight.values, weight.meta, {b_name}): "
                                                   "prune_and_compress's values and meta, then the activations",
                        code=code)

    for name, arg in (("values", values), (b_name, b)):
        if isinstance(arg, MetadataBuffer):
            refuse(f"{name} is a MetadataBuffer (the weight's metadata)")
    kind = str(getattr(meta, "dtype", "")).removeprefix("torch.")
    if not isinstance(meta, MetadataBuffer):
        if "float" in kind:
            refuse(f"meta holds {kind} numbers: the metadata is a MetadataBuffer or its integer words",
                   SP_META_ELEMENT_TYPE)
        return
    if meta.dtype not in KERNELS:
        return
    group = 2 if meta.dtype == "tf32" else 4  # (1:2 for tf32, else 2:4: half of each group kept)
    shape = (meta.m, -(-meta.k // group) * (group // 2))  # the compressed values this buffer was encoded for
    given = [tuple(int(d) for d in getattr(arg, "shape", ())) for arg in (values, b)]
    if given[0] != shape and given[1] == shape:
        refuse(f"{b_name} has the shape of the compressed values this metadata is for, {shape}, and values "
               f"{given[0]}: values and {b_name} are swapped")


def resolve_kernel_choice(values: Any, meta: Any, dtype: str | None, kernels: dict[str, Any] = KERNELS,
                          family: str = "Hopper", takes_dtype: bool = True, compressed: bool = True) -> Any:
    """The kernel of ``kernels`` for ``dtype``, or for the operand type of the metadata / values.
    Values of a narrow operand type (f16, bf16, e4m3, s8) with a MetadataBuffer tagged for another
    are refused rather than cast: f16 values read as bf16 would lose bits silently (float32 values
    take the tag's type, as the weight they came from was compressed for it). Compressed values of
    an integer type for a floating-point kernel are refused too: they are the bits of a compressed
    weight viewed as integers far more often than numbers (an int16 view of f16 values became inf),
    and so are bool values for every kernel (a keep mask: they were cast to 0 and 1 and multiplied).
    ``takes_dtype``: the caller has a ``dtype=`` (sparse_linear has not), which the help names;
    ``compressed``: ``values`` is a compressed weight (not a dense one about to be compressed)."""
    if dtype is not None:
        name = operand_type(dtype).name
    else:
        name = own = operand_of(values)
        if isinstance(meta, MetadataBuffer):
            name = meta.dtype
            if own in NARROW_OPERANDS and own != name:
                raise _tag_mismatch(own, name, takes_dtype)
        if name is None:
            raise bad_input(f"cannot tell the operand type of values of {getattr(values, 'dtype', type(values))}",
                            help=f"pass dtype= (one of {', '.join(kernels)})")
    if name not in kernels:
        raise bad_input(f"there is no {family} sparse GEMM kernel for {name} operands",
                        help=f"use one of {', '.join(kernels)}")
    if compressed and _bool_elements(values):  # (a keep mask, never a compressed weight: not cast to 0 / 1)
        raise bad_input(f"the compressed values are bools for {name} operands",
                        help=f"pass the values as {name} numbers (prune_and_compress's values); a bool array is a "
                             "keep mask: apply it to the dense weight (np.where(mask, w, 0)), then compress that")
    if compressed and name != "s8" and _integer_elements(values):
        raise bad_input(f"the compressed values are integers ({values.dtype}) for {name} operands",
                        help=f"pass the values as {name} numbers; integers holding their bits are read as "
                             f"{name} by a view (numpy: values.view(...), torch: values.view(torch dtype)); "
                             "integer numbers: cast them first (astype / .to)")
    return kernels[name]


def _bool_elements(x: Any) -> bool:
    """Whether an array's elements are bools (numpy, cupy or torch)."""
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        return False
    if array_kind(x) in ("torch", "torch-cpu"):
        return str(dtype) == "torch.bool"
    try:
        return np.dtype(dtype) == np.bool_
    except TypeError:
        return False


def _integer_elements(x: Any) -> bool:
    """Whether an array's elements are integers (numpy, cupy or torch; bool is not)."""
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        return False
    if array_kind(x) in ("torch", "torch-cpu"):
        return not dtype.is_floating_point and not dtype.is_complex and str(dtype) != "torch.bool"
    try:
        return np.issubdtype(np.dtype(dtype), np.integer)
    except TypeError:
        return False


def _tag_mismatch(own: str, tag: str, takes_dtype: bool) -> Exception:
    """SP0804 for values of operand type ``own`` with a MetadataBuffer tagged ``tag``."""
    alike = {own, tag} <= {"f16", "bf16"}  # the words of 16-bit types are alike, not of others
    other = (f", or dtype='{own}' to run them as {own}" if takes_dtype else
             f", or its words (meta.data) to run them as {own}") if alike else ""
    return bad_input(f"the values are {own} but the MetadataBuffer was encoded for {tag} operands",
                     help=f"pass values of the buffer's type ({tag}){other}"
                          + (" (the words of 16-bit types are alike)" if alike else ""))


OUT_DTYPES = {"f16": "float16", "float16": "float16", "bf16": "bfloat16", "bfloat16": "bfloat16",
              "f32": "float32", "float32": "float32", "i32": "int32", "int32": "int32"}
"""Spellings of C's element types (numpy names)."""


def checked_out_dtype(out_dtype: Any, choice: KernelChoice) -> str:
    """The numpy name of C's element type: the kernel's own (float16; int32 for s8, float32 for
    tf32) when ``out_dtype`` is None, else float16, bfloat16 or float32 for floating-point operands."""
    if out_dtype is None:
        return choice.out_dtype
    spelled = str(out_dtype)
    if not isinstance(out_dtype, str) and type(out_dtype).__module__.split(".")[0] != "torch":
        try:  # numpy dtypes and scalar types (ml_dtypes' bfloat16 too)
            spelled = np.dtype(out_dtype).name
        except TypeError:
            pass
    name = OUT_DTYPES.get(spelled.removeprefix("torch.").lower())
    if choice.out_dtype == "int32":
        allowed = ("int32",)
    else:
        allowed = ("float16", "bfloat16", "float32")
    if name not in allowed:
        raise bad_input(f"sparse_matmul has no {out_dtype} output for {choice.operand} operands",
                        help=f"out_dtype is one of {', '.join(allowed)} for {choice.operand} operands "
                        "(None: " + choice.out_dtype + ")")
    return name
