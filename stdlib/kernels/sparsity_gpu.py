"""The 2:4 sparsity toolkit on the GPU: the kernels of ``sparsity_24.spk`` as Python functions.

    from sparsile.stdlib.kernels.sparsity_gpu import compress_gpu, decompress_gpu, prune_gpu

    values, meta = compress_gpu(w, "bf16", "sm90")      # prune + compress + encode, one pass
    w_pruned = prune_gpu(w, "bf16")                     # the pruned dense matrix
    dense = decompress_gpu(values, meta)                # back to (M, K)
    validate_metadata_gpu(meta, "sm90", "bf16", m, k)   # what a launcher does

Every output is bit-identical to the host toolkit (``sparsile.stdlib.sparsity``: ``compress(w,
dtype, prune=True)`` then ``encode_metadata``), which stays the reference: magnitude pruning with
ties to the lower index, the CUTLASS rules for chunks with fewer nonzeros, negative zero counted as
zero, and the "sm90" / "tcgen05" word layouts (docs/sparse-metadata.md).

Arrays: torch CUDA tensors and cupy arrays are used in place (outputs are allocated on the same
device); numpy arrays are copied to the GPU and back by the launcher, or, with ``interpret=True``,
run through the CPU interpreter (a CPU torch tensor is read through the host). Operand types: f16,
bf16, tf32 (alias f32; 1:2), e4m3, e5m2, s8 and u8. Metadata comes back as a
:class:`DeviceMetadata` (the words where the values are, with the same tag a host
:class:`~sparsile.stdlib.sparsity.MetadataBuffer` has; ``.to_host()`` gives one).

Errors are the toolkit's :class:`~sparsile.stdlib.sparsity.SparsityError` with its SP08xx codes.
Where the GPU finds bad input (a chunk that is not 2:4 for ``prune=False``, a bad nibble), the
data is read back once and the host toolkit names the first offending position.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ..sparsity import MetadataBuffer, SparsityError, as_host_array, compress, validate_metadata
from ..sparsity.dtypes import OperandType, operand_type, operand_type_of_array
from ..sparsity.errors import (
    SP_META_ELEMENT_TYPE,
    SP_META_SHAPE,
    SP_MISSING_SIZE,
    SP_NOT_SPARSE,
    SP_UNDEFINED_NIBBLE,
    SP_VALUES_MISMATCH,
)
from ..sparsity.hostarray import checked_flag, checked_size, plain_array, require_numeric
from ..sparsity.layouts import check_format, check_supported, metadata_shape, pad_sizes
from ..sparsity.validate import ORDERED_NIBBLES, TCGEN05_UNORDERED_NIBBLES, TF32_NIBBLES, UNDEFINED_NIBBLES, check_tag
from .arrays import array_kind, bad_input, cupy_device
from .operand_cast import cast_input

KERNEL_FILE = Path(__file__).resolve().parent / "sparsity_24.spk"
# metadata words per program, rows x columns (prune_compress, decompress): 16 word rows hold both
# 32-byte halves of each 64-byte run of a weight row in the interleaved "sm90" layout, so a program
# reads whole runs (bench_sparsity_gpu.py --sweep: 0.393 ms, 78 % of HBM, for a 57344 x 8192 bf16
# weight on the H200, against 0.479 ms, 64 %, with 8 x 32 and 8 warps; benchmarks/RESULTS.md, ninth
# session). 16 x 16 with 8 warps was as fast, but converts its tile through shared memory.
WR, WC = 16, 32
NUM_WARPS = 16       # warps per program of prune_compress and decompress: 8 chunks per thread
FLAT_BLOCK = 1024    # chunks (prune_dense) or words (validate) per program

KIND = {"16-bit": "16", "tf32": "tf32"}
"""The kernel's lane rule (``KIND``) by width class; 8-bit types by magnitude encoding below."""
KIND_8BIT = {"sign-magnitude": "8f", "twos-complement": "s8", "unsigned": "u8"}

_TORCH_DTYPES = {"f16": "float16", "bf16": "bfloat16", "tf32": "float32", "e4m3": "float8_e4m3fn",
                 "e5m2": "float8_e5m2", "s8": "int8", "u8": "uint8"}
_OPERAND_OF_TORCH = {f"torch.{v}": k for k, v in _TORCH_DTYPES.items()}
_UINT = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}


@functools.cache
def kernel_module() -> Any:
    """The loaded ``sparsity_24.spk`` module (parsed once per process)."""
    from ...driver.module import load

    return load(KERNEL_FILE)


@dataclass(frozen=True, eq=False)
class DeviceMetadata:
    """Metadata words in format ``fmt`` ("sm90" or "tcgen05") for an (m, k) ``dtype`` operand,
    where the kernel wrote them (a torch/cupy uint32 array, or numpy from the interpreter)."""

    data: Any
    fmt: str
    dtype: str
    m: int
    k: int

    @property
    def operand(self) -> OperandType:
        return operand_type(self.dtype)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.data.shape)

    def to_host(self) -> MetadataBuffer:
        """The same words as a host :class:`MetadataBuffer` (what the host toolkit and
        ``sparse_matmul`` take)."""
        return MetadataBuffer(_host_words(self.data), self.fmt, self.dtype, self.m, self.k)


class GpuCompressed(NamedTuple):
    """What :func:`compress_gpu` returns: unpack it as ``values, meta = ...``."""

    values: Any
    meta: DeviceMetadata


# ------------------------------------------------------------------------------------------------
# arrays


def _placed(x: Any, what: str, interpret: bool) -> Any:
    """``x`` itself when the launch uses it in place (a torch CUDA tensor or cupy array on a GPU
    launch, a numpy array), else a host numpy array; a torch neg view (``torch._neg_view(x)``) as a
    copy with the negation applied (a launch reads memory, which holds the values before it). (``interpret``
    is checked here and in :func:`_require_gpu`, whichever an entry calls first: "no" would have run
    the interpreter.)"""
    checked_flag(interpret, "interpret")
    kind = array_kind(x)
    if not interpret and kind == "torch":
        return x.resolve_neg()
    if not interpret and kind == "cupy":
        return x
    if kind == "numpy":  # (a plain array of native byte order, as the host toolkit reads it: plain_array)
        x = plain_array(x, what)
        require_numeric(x, what)
        return x
    host = as_host_array(x, what)
    require_numeric(host, what)
    return host


def _operand(x: Any, dtype: str | OperandType | None) -> OperandType:
    """The operand type named by ``dtype`` or, when None, by ``x``'s element type."""
    if dtype is not None:
        op = operand_type(dtype)
    else:
        name = _OPERAND_OF_TORCH.get(str(x.dtype)) if array_kind(x) == "torch" else None
        found = operand_type_of_array(np.empty(0, np.dtype(x.dtype))) if array_kind(x) != "torch" else None
        op = operand_type(name) if name else found
        if op is None:
            raise bad_input(f"cannot tell the sparse operand type of an array of {x.dtype}",
                            help="pass dtype= (one of " + ", ".join(_TORCH_DTYPES) + ")")
    if op.width_class == "4-bit":
        raise bad_input(f"the GPU sparsity kernels do not handle {op.name} (4:8 in pairs) operands",
                        help="use the host toolkit: sparsile.stdlib.sparsity.compress(w, 'e2m1', prune=True)")
    return op


def _kind_of(op: OperandType) -> str:
    return KIND_8BIT[op.magnitude] if op.width_class == "8-bit" else KIND[op.width_class]


def _as_operand(x: Any, op: OperandType, group: int | None = None) -> Any:
    """``x`` cast to the operand's element type as the host casts (``cast_input``: e4m3 saturates,
    integer types refuse what they cannot hold, one rounding), 2-D, C-contiguous, K zero-padded to a
    multiple of ``group`` (default: a whole chunk)."""
    if len(x.shape) != 2:
        raise bad_input(f"w must be a 2-D (M, K) matrix, got shape {tuple(x.shape)}",
                        help="reshape to (M, K) with K the axis the sparsity runs along")
    rows, k = (int(s) for s in x.shape)
    group = group or op.group
    padded = -(-k // group) * group
    if array_kind(x) == "torch":
        import torch
        import torch.nn.functional as F

        want = getattr(torch, _TORCH_DTYPES[op.name])
        x = cast_input(x, op, want, "torch")
        if padded != k:
            ints = getattr(torch, f"int{8 * x.element_size()}" if x.element_size() > 1 else "uint8")
            x = F.pad(x.view(ints), (0, padded - k)).view(want)
        return x.contiguous()
    xp = _xp(x)
    with cupy_device(x):  # (cupy casts and allocates on its current device: x's here)
        x = cast_input(x, op, None, array_kind(x))
        if padded != k:
            grown = xp.zeros((rows, padded), dtype=x.dtype)
            grown[:, :k] = x
            x = grown
        return xp.ascontiguousarray(x)


def _xp(x: Any) -> Any:
    if array_kind(x) == "cupy":
        import cupy

        return cupy
    return np


def _view_uint(x: Any, nbytes: int) -> Any:
    """The bits of C-contiguous ``x`` as unsigned integers of ``nbytes`` (the last axis shrinks)."""
    if array_kind(x) == "torch":
        import torch

        return x.view(getattr(torch, _UINT[nbytes]))
    return x.view(_UINT[nbytes])


def _view_as(x: Any, op: OperandType) -> Any:
    """Unsigned words ``x`` reinterpreted as the operand's element type."""
    if array_kind(x) == "torch":
        import torch

        return x.view(getattr(torch, _TORCH_DTYPES[op.name]))
    return x.view(op.host_dtype) if array_kind(x) == "numpy" else x.view(np.dtype(op.host_dtype).name)


def _empty(like: Any, shape: tuple[int, ...], nbytes: int) -> Any:
    """A new unsigned array of ``nbytes`` elements where ``like`` lives."""
    if array_kind(like) == "torch":
        import torch

        return torch.empty(shape, dtype=getattr(torch, _UINT[nbytes]), device=like.device)
    with cupy_device(like):
        return _xp(like).empty(shape, dtype=_UINT[nbytes])


def _counts(like: Any, n: int) -> Any:
    """A new int32 array of ``n`` per-program counts where ``like`` lives."""
    if array_kind(like) == "torch":
        import torch

        return torch.empty((n,), dtype=torch.int32, device=like.device)
    with cupy_device(like):
        return _xp(like).empty((n,), dtype=np.int32)


def _host_words(data: Any) -> np.ndarray:
    """Metadata words copied to the host as uint32."""
    if array_kind(data) == "torch":
        import torch

        return data.contiguous().view(torch.int32).cpu().numpy().view(np.uint32)
    if array_kind(data) == "cupy":
        return data.get().view(np.uint32)
    return np.ascontiguousarray(as_host_array(data, "metadata")).view(np.uint32)


def _total(counts: Any) -> int:
    """The sum of a small per-program count array (one device synchronisation)."""
    if array_kind(counts) == "numpy":
        return int(counts.sum())
    with cupy_device(counts):
        return int(counts.sum().item())


def _launch(name: str, grid: tuple[int, ...], interpret: bool, *args: Any, **constexprs: Any) -> None:
    kernel = getattr(kernel_module(), name)
    (kernel.interpret[grid] if interpret else kernel[grid])(*args, **constexprs)


def _require_gpu(interpret: bool) -> None:
    if checked_flag(interpret, "interpret"):
        return
    from ...backend import runtime
    from ...frontend.diagnostics import LaunchError

    if not runtime.has_gpu():
        raise LaunchError("SP0731", "the GPU sparsity kernels cannot run: no NVIDIA GPU is available",
                          help="pass interpret=True to run the same kernels in the CPU interpreter")


MAX_OFFSET = 2**31 - 1
"""The kernels index chunks and words with i32 offsets."""


def _check_offsets(m: int, k: int, op: OperandType, group: int | None = None) -> None:
    """SP0804 unless the (m, k) matrix's units of ``group`` elements (default: a chunk; 1 for the
    transposable kernel, which indexes elements) fit the kernels' i32 offsets."""
    group = group or op.group
    units = m * -(-k // group)
    reach = -(-units // FLAT_BLOCK) * FLAT_BLOCK - 1  # a flat kernel's last program computes a whole block's offsets
    if reach > MAX_OFFSET:  # (within a block of 2^31, the last offsets would wrap negative and pass `offs < n`)
        noun = "chunks" if group == op.group else "elements"
        raise bad_input(f"a {m}x{k} {op.name} matrix has {units} {noun}; the GPU kernels' 32-bit offsets reach "
                        f"{MAX_OFFSET} (in whole blocks of {FLAT_BLOCK})",
                        help="split the matrix along M and process the parts separately")


def _grid(fmt: str, op: OperandType, m: int, k: int) -> tuple[tuple[int, int], int, int]:
    """(grid, Mp, KW): programs over the (Mp, KW) word grid of format ``fmt``."""
    _check_offsets(m, k, op)
    mp, kp = pad_sizes(fmt, op, m, k)
    kw = kp // (8 * op.group)
    return (max(1, -(-mp // WR)), max(1, -(-kw // WC))), mp, kw


def _even(m: int, kc: int, mp: int, kw: int) -> bool:
    """Whether every program of prune_compress / decompress covers a full tile (their EVEN: loads
    and stores without masks): no padding rows (Mp = M) or chunks (8 KW = KC), whole programs."""
    return mp == m and 8 * kw == kc and mp % WR == 0 and kw % WC == 0


# ------------------------------------------------------------------------------------------------
# the toolkit


def compress_gpu(w: Any, dtype: str | OperandType | None = None, fmt: str = "sm90", *, prune: bool = True,
                 interpret: bool = False) -> GpuCompressed:
    """Prune (``prune=True``: magnitude, ties to the lower index) and compress an (M, K) matrix into
    ``(values, meta)`` in one pass: values (M, Kg/2) in the operand's element type and the
    ``fmt`` ("sm90" or "tcgen05") metadata words, bit-identical to the host's
    ``compress(w, dtype, prune=prune)`` + ``encode_metadata(indices, fmt, dtype, k=K)``.

    ``dtype`` defaults to w's element type; w is cast to it *before* pruning (the kernels read the
    operand type), whereas the host toolkit prunes in w's own precision first: for a w already in
    the operand type the two are bit-identical; for a wider w (f32 to bf16) a near-tie that the cast
    rounds together may keep the other element (``prune_and_compress`` sends such weights to the
    host). With ``prune=False`` a chunk that is not 2:4 (1:2) raises SP0803 naming the first one.
    Outputs live where ``w`` does.
    """
    fmt = check_format(fmt)
    if fmt == "logical":
        raise bad_input("compress_gpu writes the hardware formats only, not 'logical'",
                        help="use fmt='sm90' or 'tcgen05', or the host toolkit's compress() for logical indices")
    prune = checked_flag(prune, "prune")
    _require_gpu(interpret)
    placed = _placed(w, "w", interpret)
    op = _operand(placed, dtype)
    check_supported(fmt, op)
    x = _as_operand(placed, op)
    m, k = int(placed.shape[0]), int(placed.shape[1])
    kc = int(x.shape[1]) // op.group
    chunk_bytes = op.group * op.host_dtype.itemsize
    grid, mp, kw = _grid(fmt, op, m, k)
    values = _empty(x, (m, kc), chunk_bytes // 2)
    meta = _empty(x, metadata_shape(fmt, op, m, k), 4)
    bad = _counts(x, grid[0] * grid[1])
    if m and kc:
        _launch("prune_compress", grid, interpret, _view_uint(x, chunk_bytes), values, meta, bad, m, kc, mp, kw,
                KIND=_kind_of(op), FMT=fmt, PRUNE=bool(prune), INTERLEAVED=op.interleaved, WR=WR, WC=WC,
                EVEN=_even(m, kc, mp, kw), num_warps=NUM_WARPS)
    if not prune and m and kc and _total(bad):
        compress(as_host_array(w, "w"), op.name)  # the host names the first offending chunk (SP0803)
        raise bad_input("w is not 2:4 sparse", code=SP_NOT_SPARSE)  # pragma: no cover - the host raised
    return GpuCompressed(_view_as(values, op), DeviceMetadata(meta, fmt, op.name, m, k))


def prune_gpu(w: Any, dtype: str | OperandType | None = None, *, interpret: bool = False) -> Any:
    """The magnitude-pruned (M, K) matrix (2:4; 1:2 for tf32; ties to the lower index), in the
    operand's element type, where ``w`` lives: bit-identical to the host's ``prune(w, dtype)`` of
    w cast to the operand type."""
    _require_gpu(interpret)
    placed = _placed(w, "w", interpret)
    op = _operand(placed, dtype)
    x = _as_operand(placed, op)
    k = int(placed.shape[1])
    chunk_bytes = op.group * op.host_dtype.itemsize
    _check_offsets(int(x.shape[0]), int(x.shape[1]), op)
    chunks = _view_uint(x, chunk_bytes)
    out = _empty(x, tuple(int(s) for s in chunks.shape), chunk_bytes)
    n = int(chunks.shape[0]) * int(chunks.shape[1])
    if n:
        _launch("prune_dense", (-(-n // FLAT_BLOCK),), interpret, chunks, out, n, KIND=_kind_of(op))
    return _view_as(out, op)[:, :k]


def _accepted(op: OperandType, fmt: str, allow_unordered: bool) -> int:
    """The 16-bit mask of nibbles ``validate_metadata`` accepts (bit n set: nibble n is valid)."""
    if op.width_class == "tf32":
        ok = set(TF32_NIBBLES)
    elif not allow_unordered:
        ok = set(ORDERED_NIBBLES)
    elif fmt == "sm90":
        ok = set(range(16)) - set(UNDEFINED_NIBBLES)
    else:
        ok = set(ORDERED_NIBBLES) | set(TCGEN05_UNORDERED_NIBBLES)
    return sum(1 << n for n in ok)


def _dtype_name(data: Any) -> str:
    return str(getattr(data, "dtype", type(data).__name__)).removeprefix("torch.")


def validate_metadata_gpu(meta: Any, fmt: str | None = None, dtype: str | OperandType | None = None,
                          m: int | None = None, k: int | None = None, *, allow_unordered: bool = False,
                          interpret: bool = False) -> DeviceMetadata:
    """Check metadata on the GPU as the host's ``validate_metadata`` does (the same codes and
    messages): the tag against ``fmt``/``dtype``/``m``/``k`` (SP0809, SP0810, SP0812), the shape
    (SP0805) and element type (SP0806) on the host, then every nibble, padding included, in one
    kernel (SP0807 undefined, SP0808 unordered unless ``allow_unordered``; SP0809 for a tf32
    buffer full of 2:4 codes). ``meta`` is a :class:`DeviceMetadata`, a host
    :class:`MetadataBuffer`, or a raw word array with ``fmt``, ``dtype``, ``m`` and ``k``.
    Returns it as a :class:`DeviceMetadata`. Only a failing check reads the words back."""
    # sizes as the host checks them (SP0804): int() would take 32.7 for 32, "32" and True for sizes
    m, k = (None if v is None else checked_size(v, name) for v, name in ((m, "m"), (k, "k")))
    allow_unordered = checked_flag(allow_unordered, "allow_unordered")  # ("no" would loosen the check)
    if isinstance(meta, (DeviceMetadata, MetadataBuffer)):
        check_tag(meta, fmt, dtype, m, k)
        fmt, op, m, k, data = meta.fmt, meta.operand, meta.m, meta.k, meta.data
    else:
        if fmt is None or dtype is None or m is None or k is None:
            raise SparsityError(SP_MISSING_SIZE, "a raw metadata array needs fmt=, dtype=, m= and k= to be checked",
                                help="pass the DeviceMetadata returned by compress_gpu(), or give fmt, dtype, m, k")
        fmt, op, data = check_format(fmt), operand_type(dtype), meta
    if fmt == "logical":
        raise bad_input("the GPU validation checks the hardware formats only, not 'logical'",
                        help="use the host toolkit's validate_metadata() for logical indices")
    _require_gpu(interpret)
    check_supported(fmt, op)
    data = _placed(data, "metadata", interpret)
    expected = metadata_shape(fmt, op, int(m), int(k))
    if tuple(int(s) for s in data.shape) != expected:  # the host names the widths whose shape it has
        validate_metadata(np.broadcast_to(np.uint32(0), tuple(data.shape)), fmt, op.name, m, k)
        raise bad_input(f"{fmt} metadata must have shape {expected}", code=SP_META_SHAPE)  # pragma: no cover
    if _dtype_name(data) not in ("uint32", "int32"):
        raise SparsityError(SP_META_ELEMENT_TYPE, f"{fmt} metadata must be uint32 words, found {_dtype_name(data)}",
                            help="pass the array produced by compress_gpu() or encode_metadata() (or its .data)")
    with cupy_device(data):
        words = _view_uint(data.contiguous() if array_kind(data) == "torch" else _xp(data).ascontiguousarray(data), 4)
    n = int(np.prod(expected))
    bad = _counts(words, max(1, -(-n // FLAT_BLOCK)))
    if n:
        _launch("validate", (int(bad.shape[0]),), interpret, words.reshape(-1), bad, n,
                ACCEPT=_accepted(op, fmt, allow_unordered))
        if _total(bad):
            validate_metadata(_host_words(words), fmt, op.name, m, k, allow_unordered=allow_unordered)
            raise bad_input("metadata holds invalid nibbles", code=SP_UNDEFINED_NIBBLE)  # pragma: no cover
    return DeviceMetadata(words, fmt, op.name, int(m), int(k))


def decompress_gpu(values: Any, meta: Any, fmt: str | None = None, dtype: str | OperandType | None = None, *,
                   m: int | None = None, k: int | None = None, allow_unordered: bool = False,
                   interpret: bool = False) -> Any:
    """The dense (m, k) operand from ``values`` (M, Kg/2) and "sm90"/"tcgen05" metadata, where the
    values live: bit-identical to the host's ``decompress``. The metadata is validated first
    (:func:`validate_metadata_gpu`, same arguments); stored pairs are read in their stored order."""
    placed = _placed(values, "values", interpret)
    if not isinstance(meta, (DeviceMetadata, MetadataBuffer)) and len(placed.shape) == 2:
        m = int(placed.shape[0]) if m is None else m
        k = 2 * int(placed.shape[1]) if k is None else k
    checked = validate_metadata_gpu(meta, fmt, dtype, m, k, allow_unordered=allow_unordered, interpret=interpret)
    op = checked.operand
    m, k = checked.m, checked.k
    kc = -(-k // op.group)
    chunk_bytes = op.group * op.host_dtype.itemsize
    if tuple(int(s) for s in placed.shape) != (m, kc * op.group // 2) or _dtype_name(placed) != (
            _TORCH_DTYPES[op.name] if array_kind(placed) == "torch" else np.dtype(op.host_dtype).name):
        raise SparsityError(SP_VALUES_MISMATCH, f"values must be a ({m}, {kc * op.group // 2}) {op.name} array "
                            f"for this metadata, got {tuple(placed.shape)} {_dtype_name(placed)}",
                            help="pass the values returned by compress_gpu() together with its metadata")
    with cupy_device(placed):
        vals = placed.contiguous() if array_kind(placed) == "torch" else _xp(placed).ascontiguousarray(placed)
    dense = _empty(vals, (m, kc), chunk_bytes)
    grid, mp, kw = _grid(checked.fmt, op, m, k)
    if m and kc:
        _launch("decompress", grid, interpret, _view_uint(vals, chunk_bytes // 2), checked.data, dense, m, kc, mp, kw,
                KIND=_kind_of(op), FMT=checked.fmt, INTERLEAVED=op.interleaved, WR=WR, WC=WC,
                EVEN=_even(m, kc, mp, kw), num_warps=NUM_WARPS)
    return _view_as(dense, op)[:, :k]


TRANSPOSABLE_FILE = Path(__file__).resolve().parent / "sparsity_transposable.spk"
TRANSPOSABLE_BQ = 128  # 4x4 blocks per program along K (the kernel's default BQ)


@functools.cache
def transposable_module() -> Any:
    """The loaded ``sparsity_transposable.spk`` module (parsed once per process)."""
    from ...driver.module import load

    return load(TRANSPOSABLE_FILE)


def prune_transposable_gpu(w: Any, *, interpret: bool = False) -> Any:
    """``w`` (M, K) with every element outside the best transposable 2:4 pattern of its 4x4 block
    set to zero (2:4 along rows and columns; docs/sparse-metadata.md §12), in w's element type and
    where w lives. The same choice as the host's ``prune_transposable_2_4``, bit for bit (both add
    the same f64 magnitudes in the same order, so even rounded bf16 and f32 sums agree)."""
    _require_gpu(interpret)
    placed = _placed(w, "w", interpret)
    op = _operand(placed, None)
    if len(placed.shape) == 2:  # the kernel indexes elements: (M rounded to 4) x (K rounded to 4)
        _check_offsets(-(-int(placed.shape[0]) // 4) * 4, -(-int(placed.shape[1]) // 4) * 4, op, 1)
    x = _as_operand(placed, op, 4)
    m, k = int(placed.shape[0]), int(placed.shape[1])
    out = _view_as(_empty(x, (m, int(x.shape[1]) * op.host_dtype.itemsize), 1), op)
    if m and k:
        kp = int(x.shape[1])
        grid = (-(-m // 4), -(-(kp // 4) // TRANSPOSABLE_BQ))
        kernel = transposable_module().prune_transposable
        (kernel.interpret[grid] if interpret else kernel[grid])(x, out, m, kp, PATTERNS=pattern_bits())
    return out[:, :k]


@functools.cache
def pattern_bits() -> tuple[int, ...]:
    """The host's 90 transposable 4x4 patterns as 16-bit masks (bit 4r + c = row r, column c)."""
    from ..sparsity.transposable import PATTERNS

    return tuple(int(sum(1 << int(i) for i in np.flatnonzero(p))) for p in PATTERNS)
