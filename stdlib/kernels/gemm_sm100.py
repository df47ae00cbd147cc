"""``sparse_matmul(..., target="sm_100a")``: the Blackwell 2:4 sparse GEMM as a Python function.

    C (M x N) = decompress(values, meta) (M x K) @ b.T            b stored N x K

The kernels are ``sparse_gemm_sm100_persistent.spk`` (default: a grid of ``min(#tiles, #SMs)``
programs, each looping over its tiles with a double-buffered TMEM accumulator) and
``sparse_gemm_sm100.spk`` (``persistent=False``: one program per BM x BN tile). Both read every
operand by TMA, so the arrays are prepared for it here:

* **metadata** in the "tcgen05" format (docs/sparse-metadata.md §5) as the 2-D view
  ``(-1, 4)`` u32. A tagged :class:`MetadataBuffer` in another format ("sm90", "logical") is
  re-encoded once on the host (cached per buffer); a raw array must already be "tcgen05" words,
  either ``(Kp/atomK, Mp/128, 128, 4)`` or its ``(-1, 4)`` view (SP0806 otherwise).
* **K**: the values and b rows are zero-padded to 16-byte rows (``KernelChoice.k_align``), and the
  launch K never exceeds the K the metadata atoms cover (a K step past them would read
  out-of-bounds metadata, zero nibbles, whose meaning is undefined: docs/hardware.md §3).
* **C** is written by TMA stores, whose rows must be 16-byte multiples: for an N that is not, the
  kernel writes a C with padded columns and the first N columns are handed back (a copy).

Nothing here ran on a Blackwell GPU (none was available); the same plan runs in the interpreter
(``interpret=True``) and compiles for every Blackwell target (:meth:`SparseMatmulSm100.compile`).
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..sparsity import MetadataBuffer, decode_metadata, encode_metadata
from ..sparsity.dtypes import OperandType, operand_type
from ..sparsity.errors import SP_META_SHAPE
from ..sparsity.formats import metadata_shape
from ..sparsity.validate import checked_metadata
from .arrays import array_kind, as_u32_words, bad_input, pad_columns, placed_array
from .gemm import matmul_output
from .gemm_choice import KernelChoice
from .gemm_operands import checked_operands, validated_metadata

KERNEL_DIR = Path(__file__).resolve().parent
PERSISTENT_FILE = KERNEL_DIR / "sparse_gemm_sm100_persistent.spk"
TILE_FILE = KERNEL_DIR / "sparse_gemm_sm100.spk"
BLACKWELL_TARGETS = ("sm_100a", "sm_103a", "sm_110a")
TARGET_OF_CAPABILITY = {(10, 0): "sm_100a", (10, 3): "sm_103a", (11, 0): "sm_110a"}
DEFAULT_SM_COUNT = 148
"""SMs of a B200, the grid bound used when there is no device to ask (``num_sms=`` overrides)."""
BM = 128  # rows of C per tile: one M = 128 tcgen05 instruction tile


@dataclass(frozen=True)
class KernelChoiceSm100(KernelChoice):
    """A kernel of the sm100 files for one operand type: its N tile in the persistent kernel
    (``bn``: 2·BN accumulator columns + 16 metadata columns fit the 512 TMEM columns) and in the
    one-tile kernel (``tile_bn``), and the K one metadata atom covers (= the kernel's BK)."""

    bn: int = 128
    tile_bn: int = 128
    atom_k: int = 128

    def block_n(self, n: int, persistent: bool = True) -> int:  # type: ignore[override]
        return self.bn if persistent else self.tile_bn


KERNELS_SM100: dict[str, KernelChoiceSm100] = {c.operand: c for c in (
    KernelChoiceSm100("f16", "sparse_gemm_f16", 2, "float16", "float16", 128, bn=128, tile_bn=128, atom_k=128),
    KernelChoiceSm100("bf16", "sparse_gemm_bf16", 2, "float16", "bfloat16", 128, bn=128, tile_bn=128, atom_k=128),
    KernelChoiceSm100("tf32", "sparse_gemm_tf32", 4, "float16", "float32", 128, bn=128, tile_bn=128, atom_k=64),
    KernelChoiceSm100("e4m3", "sparse_gemm_e4m3", 1, "float16", "float8_e4m3fn", 192, bn=192, tile_bn=256, atom_k=128),
    KernelChoiceSm100("s8", "sparse_gemm_i8", 1, "int32", "int8", 192, bn=192, tile_bn=256, atom_k=128),
)}
"""Operand types with a Blackwell kernel (the kernels' default BN). C is float16, int32 for s8
(the Blackwell tf32 kernel stores f16, unlike the Hopper one). s8 needs kind::i8: not sm_103a."""


def is_blackwell(target: str | None) -> bool:
    return target in BLACKWELL_TARGETS


@functools.cache
def kernel_module(persistent: bool = True) -> Any:
    """The loaded kernel module (parsed once per process)."""
    from ...driver.module import load

    return load(PERSISTENT_FILE if persistent else TILE_FILE)


def device_target() -> str | None:
    """The Blackwell target of the GPU being planned for (the arrays' device, else the current one:
    :func:`~.plan_device.plan_gpu`), or None (no GPU, or not a Blackwell one)."""
    from ...backend import runtime
    from .plan_device import plan_gpu

    if not runtime.has_gpu():
        return None
    return TARGET_OF_CAPABILITY.get(tuple(plan_gpu().compute_capability))  # type: ignore[arg-type]


def device_sm_count(interpret: bool) -> int:
    """The SM count of the GPU being planned for (:func:`~.plan_device.plan_gpu`; ``DEFAULT_SM_COUNT``
    in the interpreter or without one)."""
    if not interpret:
        from ...backend import runtime
        from .plan_device import plan_gpu

        if runtime.has_gpu():
            return int(plan_gpu().sm_count)
    return DEFAULT_SM_COUNT


def persistent_grid(num_tiles: int, num_sms: int) -> int:
    """Programs of the persistent kernel: one per SM, never more than there are tiles."""
    if num_sms < 1:
        raise bad_input(f"num_sms must be at least 1, got {num_sms}", help="pass the GPU's SM count (148 on a B200)")
    return max(1, min(num_tiles, num_sms))


# ------------------------------------------------------------------------------------------------
# metadata


_converted: weakref.WeakKeyDictionary[MetadataBuffer, MetadataBuffer] = weakref.WeakKeyDictionary()
_device_copies: weakref.WeakKeyDictionary[MetadataBuffer, dict[str, Any]] = weakref.WeakKeyDictionary()


def tcgen05_metadata(meta: MetadataBuffer) -> MetadataBuffer:
    """``meta`` in the "tcgen05" format: itself, or re-encoded from its logical indices (once)."""
    if meta.fmt == "tcgen05":
        return meta
    if meta not in _converted:
        indices = decode_metadata(meta)
        _converted[meta] = encode_metadata(indices, "tcgen05", meta.dtype, k=meta.k)
    return _converted[meta]


def _tagged(meta: MetadataBuffer, op: OperandType, m: int, k_values: int, k_b: int) -> tuple[Any, int]:
    """(words, K covered by the metadata atoms) of a tagged buffer, validated once per (type, m)."""
    tc = validated_metadata(tcgen05_metadata(meta), "tcgen05", op, m, k_values, k_b)
    return tc.data, int(tc.data.shape[0]) * KERNELS_SM100[op.name].atom_k


def _raw(meta: Any, op: OperandType, m: int, k_values: int, k_b: int) -> tuple[Any, int]:
    """(words, K covered) of a raw "tcgen05" word array: its shape must be the 4-D format of K
    ``k_values`` or ``k_b`` (or their ``(-1, 4)`` view); a host array's nibbles are checked."""
    shape = tuple(int(s) for s in getattr(meta, "shape", ()))
    fits = {k: metadata_shape("tcgen05", op, m, k) for k in (k_values, k_b)}
    flat = {k: (s[0] * s[1] * s[2], 4) for k, s in fits.items()}
    k = next((k for k in fits if shape in (fits[k], flat[k])), None)
    if k is None:
        want = " or ".join(sorted({str(s) for s in fits.values()} | {str(s) for s in flat.values()}))
        raise bad_input(f"tcgen05 metadata of a {op.name} operand with M = {m}, K = {k_b} has shape {want}, "
                        f"got {shape}", code=SP_META_SHAPE,
                        help='encode it with encode_metadata(indices, "tcgen05", dtype)')
    if array_kind(meta) == "numpy":
        checked_metadata(as_u32_words(meta).reshape(fits[k]), "tcgen05", op.name, m, k)  # (no buffer: no copy)
    return meta, fits[k][0] * KERNELS_SM100[op.name].atom_k


# ------------------------------------------------------------------------------------------------
# the prepared launch


@dataclass(frozen=True, eq=False)
class SparseMatmulSm100:
    """One prepared launch of a Blackwell sparse GEMM: checked, padded arguments, kernel, grid.

    ``out`` is what the kernel writes ((m, n_padded) when N needed padding); :meth:`result` is C.
    """

    choice: KernelChoiceSm100
    target: str
    persistent: bool
    m: int
    n: int
    k: int            # K of b before padding
    k_launch: int     # K the kernel is launched with (16-byte rows, within the metadata atoms)
    values: Any
    meta: Any         # (-1, 4) u32 "tcgen05" words
    b: Any
    out: Any
    num_sms: int

    @property
    def bn(self) -> int:
        return self.choice.block_n(self.n, self.persistent)

    @property
    def num_tiles(self) -> int:
        return -(-self.m // BM) * -(-self.n // self.bn)

    @property
    def grid(self) -> tuple[int]:
        """Persistent: ``min(#tiles, num_sms)`` programs; otherwise one per tile."""
        return (persistent_grid(self.num_tiles, self.num_sms) if self.persistent else self.num_tiles,)

    @property
    def kernel(self) -> Any:
        return getattr(kernel_module(self.persistent), self.choice.kernel)

    def arguments(self) -> tuple[Any, ...]:
        return (self.values, self.meta, self.b, self.out, self.m, self.n, self.k_launch)

    def compile(self, target: str | None = None) -> Any:
        """Compile (through the compile cache) for ``target`` (default: the plan's); returns the
        CompiledKernel. Needs no GPU."""
        return self.kernel[self.grid].compile_for(target or self.target, *self.arguments())

    def run(self, interpret: bool = False) -> Any:
        """Launch on the current GPU (or run in the interpreter) and return ``out``."""
        if self.m and self.n:
            launch = self.kernel.interpret[self.grid] if interpret else self.kernel[self.grid]
            launch(*self.arguments())
        return self.out

    def result(self) -> Any:
        """C (m, n): ``out``, or its first n columns (a contiguous copy) when they were padded."""
        if int(self.out.shape[1]) == self.n:
            return self.out
        c = self.out[:, :self.n]
        return c.contiguous() if array_kind(c) in ("torch", "torch-cpu") else c.copy()


def resolve_operand(values: Any, meta: Any, dtype: str | None) -> KernelChoiceSm100:
    from .gemm_choice import resolve_kernel_choice

    return resolve_kernel_choice(values, meta, dtype, KERNELS_SM100, "Blackwell")


def plan_sparse_matmul_sm100(values: Any, meta: Any, b: Any, *, target: str, out: Any = None, dtype: str | None = None,
                             interpret: bool = False, persistent: bool = True,
                             num_sms: int | None = None) -> SparseMatmulSm100:
    """Check and pad the arguments of ``sparse_matmul(..., target=<Blackwell>)`` and pick the
    kernel and grid, without launching."""
    home = b
    choice, values, words, b, m, n, k, k_launch = checked_sm100_operands(values, meta, b, target, dtype, interpret)
    out_align = 16 // (4 if choice.out_dtype == "int32" else 2)
    n_padded = -(-n // out_align) * out_align
    if n_padded == n:
        c = matmul_output(out, m, n, choice, home, interpret, reads=(values, words))
    else:
        if out is not None:
            matmul_output(out, m, n, choice, home, True)  # shape / type check only
        c = matmul_output(None, m, n_padded, choice, home, interpret)
    sms = device_sm_count(interpret) if num_sms is None else int(num_sms)
    plan = SparseMatmulSm100(choice, target, persistent, m, n, k, k_launch, values, words, b, c, sms)
    persistent_grid(plan.num_tiles, sms)  # checks num_sms
    return plan


def checked_sm100_operands(values: Any, meta: Any, b: Any, target: str, dtype: str | None, interpret: bool
                           ) -> tuple[KernelChoiceSm100, Any, Any, Any, int, int, int, int]:
    """The operands of a Blackwell launch, checked, placed and padded: (choice, values, "tcgen05"
    words as (-1, 4) u32, b, M, N, K of b, the K to launch with)."""
    if not is_blackwell(target):
        raise bad_input(f"{target!r} is not a Blackwell target", help=f"use one of {', '.join(BLACKWELL_TARGETS)}")
    choice = resolve_operand(values, meta, dtype)
    op = operand_type(choice.operand)
    values, b, m, n, k, k_values = checked_operands(values, b, choice, op, interpret)
    if isinstance(meta, MetadataBuffer):
        words, k_meta = _tagged(meta, op, m, k_values, k)
        if array_kind(values) in ("torch", "cupy"):  # one device copy per buffer and device
            from .arrays import copy_like

            copies = _device_copies.setdefault(tcgen05_metadata(meta), {})
            device = str(getattr(values, "device", "cupy"))
            if device not in copies:
                copies[device] = copy_like(as_u32_words(words), values)
            words = copies[device]
    else:
        words, k_meta = _raw(placed_array(meta, "meta", interpret), op, m, k_values, k)
    words = as_u32_words(words).reshape(-1, 4)
    k_padded = -(-k_values // choice.k_align) * choice.k_align
    values = pad_columns(values, k_padded // 2)
    b = pad_columns(b, k_padded)
    return choice, values, words, b, m, n, k, min(k_padded, k_meta)
