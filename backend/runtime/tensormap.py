"""TMA tensor maps: description, validation and encoding (``cuTensorMapEncodeTiled``).

A :class:`TensorMapSpec` describes a tiled tensor map **in array order** (outermost dimension
first, like a numpy shape; strides in bytes for every dimension, the innermost one being the
element size). The driver wants the reverse (innermost first, ``globalStrides`` without the
innermost entry): :meth:`TensorMapSpec.driver_arguments` does that conversion, so TMA coordinate
``c0`` in PTX is the *last* array dimension.

Validation implements docs/hardware.md §5.4 plus the ``cuTensorMapEncodeTiled`` documentation
(CUDA 13): rank 1..5 (>= 3 when interleaved), base address 16-byte aligned (32 for 32-byte
interleave and the 16U4/16U6 ALIGN16B types), dims in 1..2^32, outer strides multiples of 16 (32)
and < 2^40, box dims 1..256, inner box bytes a multiple of 16 (no interleave) and at most the
swizzle span, element strides 1..8, interleave 32B only with swizzle 32B, NaN fill only for
floating types. Every violation is collected; :meth:`TensorMapSpec.validate` raises one SP0714
:class:`~sparsile.frontend.diagnostics.LaunchError` naming them all.
"""

from __future__ import annotations

import enum
import math
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ...frontend.diagnostics import LaunchError
from ...target.tma_layout import global_layout_problems
from .arrays import ArrayInfo
from .codes import ARG_SHAPE, TENSOR_MAP
from .dtypes import dtype_info

TENSOR_MAP_BYTES = 128
TENSOR_MAP_ALIGN = 64
MAX_RANK = 5
MAX_BOX_DIM = 256
MAX_ELEMENT_STRIDE = 8
TENSOR_MAP_CACHE_SIZE = 1024
"""Encoded maps a launcher (or the prepared launches, together) keeps: at most 128 KiB of 128-byte
maps, enough for every weight and activation map of a large model's layers."""


class TmaDataType(enum.IntEnum):
    """``CUtensorMapDataType`` (docs/hardware.md §5.4)."""

    UINT8 = 0
    UINT16 = 1
    UINT32 = 2
    INT32 = 3
    UINT64 = 4
    INT64 = 5
    FLOAT16 = 6
    FLOAT32 = 7
    FLOAT64 = 8
    BFLOAT16 = 9
    FLOAT32_FTZ = 10
    TFLOAT32 = 11
    TFLOAT32_FTZ = 12
    U4X16_ALIGN8B = 13
    U4X16_ALIGN16B = 14
    U6X16_ALIGN16B = 15

    @property
    def bits(self) -> int:
        """Bits per element in global memory (packed types count single U4/U6 values)."""
        return _TMA_BITS[self]

    @property
    def is_float(self) -> bool:
        return self in (TmaDataType.FLOAT16, TmaDataType.FLOAT32, TmaDataType.FLOAT64,
                        TmaDataType.BFLOAT16, TmaDataType.FLOAT32_FTZ, TmaDataType.TFLOAT32,
                        TmaDataType.TFLOAT32_FTZ)

    @property
    def is_packed(self) -> bool:
        return self >= TmaDataType.U4X16_ALIGN8B


_TMA_BITS = {TmaDataType.UINT8: 8, TmaDataType.UINT16: 16, TmaDataType.UINT32: 32, TmaDataType.INT32: 32,
             TmaDataType.UINT64: 64, TmaDataType.INT64: 64, TmaDataType.FLOAT16: 16, TmaDataType.FLOAT32: 32,
             TmaDataType.FLOAT64: 64, TmaDataType.BFLOAT16: 16, TmaDataType.FLOAT32_FTZ: 32,
             TmaDataType.TFLOAT32: 32, TmaDataType.TFLOAT32_FTZ: 32, TmaDataType.U4X16_ALIGN8B: 4,
             TmaDataType.U4X16_ALIGN16B: 4, TmaDataType.U6X16_ALIGN16B: 6}

TMA_DTYPE_OF: dict[str, TmaDataType] = {
    "bool": TmaDataType.UINT8, "i8": TmaDataType.UINT8, "u8": TmaDataType.UINT8,
    "e4m3": TmaDataType.UINT8, "e5m2": TmaDataType.UINT8,
    "i16": TmaDataType.UINT16, "u16": TmaDataType.UINT16,
    "f16": TmaDataType.FLOAT16, "bf16": TmaDataType.BFLOAT16,
    "i32": TmaDataType.INT32, "u32": TmaDataType.UINT32, "f32": TmaDataType.FLOAT32,
    "tf32": TmaDataType.TFLOAT32, "i64": TmaDataType.INT64, "u64": TmaDataType.UINT64,
    "f64": TmaDataType.FLOAT64,
}
"""The TMA element type that moves each language dtype (8-bit floats travel as bytes)."""


class Swizzle(enum.IntEnum):
    """``CUtensorMapSwizzle``; ``span`` is the swizzle width in bytes (0 = none)."""

    NONE = 0
    B32 = 1
    B64 = 2
    B128 = 3
    B128_ATOM_32B = 4
    B128_ATOM_32B_FLIP_8B = 5
    B128_ATOM_64B = 6

    @property
    def span(self) -> int:
        return {0: 0, 1: 32, 2: 64}.get(int(self), 128)


class Interleave(enum.IntEnum):
    """``CUtensorMapInterleave``."""

    NONE = 0
    B16 = 1
    B32 = 2


class L2Promotion(enum.IntEnum):
    """``CUtensorMapL2promotion``."""

    NONE = 0
    B64 = 1
    B128 = 2
    B256 = 3


class OobFill(enum.IntEnum):
    """``CUtensorMapFloatOOBfill``: out-of-bounds elements read as zero, or as a NaN that
    requests a zero FMA (floating types only)."""

    NONE = 0
    NAN_REQUEST_ZERO_FMA = 1


def _as_dtype(dtype: Any) -> TmaDataType:
    if isinstance(dtype, TmaDataType):
        return dtype
    if isinstance(dtype, str):
        if dtype in TMA_DTYPE_OF:
            return TMA_DTYPE_OF[dtype]
        try:
            return TmaDataType[dtype.upper()]
        except KeyError:
            pass
    raise LaunchError(TENSOR_MAP, f"tensor map dtype {dtype!r} is not supported",
                      f"use one of {', '.join(TMA_DTYPE_OF)} or a TmaDataType")


@dataclass(frozen=True)
class TensorMapSpec:
    """A tiled tensor map in array order (outermost first). ``global_strides`` are in bytes and
    have one entry per dimension; the innermost must equal the element size (tiled TMA reads
    dense inner rows). ``element_strides`` default to all ones."""

    dtype: TmaDataType
    global_shape: tuple[int, ...]
    global_strides: tuple[int, ...]
    box_shape: tuple[int, ...]
    element_strides: tuple[int, ...] | None = None
    swizzle: Swizzle = Swizzle.NONE
    interleave: Interleave = Interleave.NONE
    l2_promotion: L2Promotion = L2Promotion.NONE
    oob_fill: OobFill = OobFill.NONE

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", _as_dtype(self.dtype))
        for name in ("global_shape", "global_strides", "box_shape"):
            object.__setattr__(self, name, tuple(int(v) for v in getattr(self, name)))
        strides = self.element_strides
        object.__setattr__(self, "element_strides", tuple(int(v) for v in strides) if strides is not None
                           else (1,) * len(self.global_shape))
        object.__setattr__(self, "swizzle", Swizzle(self.swizzle))
        object.__setattr__(self, "interleave", Interleave(self.interleave))
        object.__setattr__(self, "l2_promotion", L2Promotion(self.l2_promotion))
        object.__setattr__(self, "oob_fill", OobFill(self.oob_fill))

    @classmethod
    def for_array(cls, dtype: str, shape: tuple[int, ...], strides_elements: tuple[int, ...],
                  box_shape: tuple[int, ...], **options: Any) -> TensorMapSpec:
        """The spec of a language-dtype array given its shape and element strides. A dimension of
        size 1 gets the packed stride: only its coordinate 0 is in bounds, so its stride is never
        used, and torch calls a single row of any row stride contiguous (``hidden[:, -1, :]``),
        whose stride would break the 16-byte rule of the outer strides."""
        itemsize = dtype_info(dtype).itemsize
        strides = list(strides_elements)
        for i in range(len(strides) - 2, -1, -1):
            if shape[i] == 1:
                strides[i] = strides[i + 1] * max(int(shape[i + 1]), 1)
        return cls(dtype, shape, tuple(s * itemsize for s in strides), box_shape, **options)

    @property
    def rank(self) -> int:
        return len(self.global_shape)

    @property
    def inner_box_bytes(self) -> int:
        """Bytes of one innermost box row (the quantity the swizzle and 16-byte rules constrain)."""
        return self.box_shape[-1] * self.dtype.bits // 8 if self.box_shape else 0

    @property
    def box_bytes(self) -> int:
        """Bytes one load of the box writes to shared memory, out-of-bounds fill included (the
        ``expect_tx`` count, docs/hardware.md §5.2)."""
        counts = [math.ceil(b / e) if e > 0 else 0 for b, e in zip(self.box_shape, self.element_strides)]
        return math.prod(counts) * self.dtype.bits // 8

    def problems(self, address: int | None = None) -> list[str]:
        """Every rule of docs/hardware.md §5.4 / the driver documentation this spec breaks."""
        out: list[str] = []
        rank = self.rank
        if not 1 <= rank <= MAX_RANK:
            return [f"rank {rank} is outside 1..{MAX_RANK}"]
        for name in ("global_strides", "box_shape", "element_strides"):
            if len(getattr(self, name)) != rank:
                out.append(f"{name} has {len(getattr(self, name))} entries for a rank-{rank} tensor")
        if out:
            return out
        dt, inter, swz = self.dtype, self.interleave, self.swizzle
        wide_align = inter == Interleave.B32 or dt in (TmaDataType.U4X16_ALIGN16B, TmaDataType.U6X16_ALIGN16B)
        align = 32 if wide_align else 16
        if inter != Interleave.NONE and rank < 3:
            out.append(f"interleaved layouts need rank >= 3, got {rank}")
        if address is not None and address % align:
            out.append(f"global address {address:#x} is not {align}-byte aligned")
        out.extend(global_layout_problems(self.global_shape, self.global_strides, align))
        if not dt.is_packed and self.global_strides[-1] != dt.bits // 8:
            out.append(f"innermost stride is {self.global_strides[-1]} bytes; tiled TMA needs a dense "
                       f"innermost dimension ({dt.bits // 8} bytes)")
        for axis, b in enumerate(self.box_shape):
            if not 1 <= b <= MAX_BOX_DIM:
                out.append(f"box dimension {axis} = {b} is outside 1..{MAX_BOX_DIM}")
        inner_bytes = self.box_shape[-1] * dt.bits / 8
        if inter == Interleave.NONE and inner_bytes % 16:
            out.append(f"inner box dimension is {inner_bytes:g} bytes, not a multiple of 16")
        if inter == Interleave.NONE and swz != Swizzle.NONE and inner_bytes > swz.span:
            out.append(f"inner box dimension is {inner_bytes:g} bytes, more than the {swz.span}-byte "
                       f"swizzle span of {swz.name}")
        if inter == Interleave.B32 and swz != Swizzle.B32:
            out.append(f"32-byte interleave requires swizzle B32, got {swz.name}")
        for axis, e in enumerate(self.element_strides):
            if not 1 <= e <= MAX_ELEMENT_STRIDE:
                out.append(f"element stride of dimension {axis} = {e} is outside 1..{MAX_ELEMENT_STRIDE}")
        out.extend(self._packed_problems())
        if self.oob_fill == OobFill.NAN_REQUEST_ZERO_FMA and not dt.is_float:
            out.append(f"NaN out-of-bounds fill needs a floating-point type, got {dt.name}")
        return out

    def _packed_problems(self) -> list[str]:
        dt, out = self.dtype, []
        inner_dim, inner_box = self.global_shape[-1], self.box_shape[-1]
        if dt in (TmaDataType.U4X16_ALIGN16B, TmaDataType.U6X16_ALIGN16B):
            if inner_dim % 128:
                out.append(f"{dt.name} needs an innermost dimension that is a multiple of 128, got "
                           f"{inner_dim}")
            if inner_box != 128:
                out.append(f"{dt.name} needs an innermost box of 128, got {inner_box}")
        if dt == TmaDataType.U4X16_ALIGN8B and inner_dim % 2:
            out.append(f"{dt.name} needs an even innermost dimension, got {inner_dim}")
        allowed = {TmaDataType.U6X16_ALIGN16B: (Swizzle.NONE, Swizzle.B128, Swizzle.B128_ATOM_32B,
                                                Swizzle.B128_ATOM_64B),
                   TmaDataType.U4X16_ALIGN16B: (Swizzle.NONE, Swizzle.B128, Swizzle.B128_ATOM_32B)}.get(dt)
        if allowed is not None and self.swizzle not in allowed:
            out.append(f"{dt.name} does not support swizzle {self.swizzle.name}")
        if dt == TmaDataType.U6X16_ALIGN16B and self.interleave != Interleave.NONE:
            out.append(f"{dt.name} requires interleave NONE")
        return out

    def validate(self, address: int | None = None, what: str = "tensor map") -> None:
        problems = self.problems(address)
        if problems:
            raise LaunchError(TENSOR_MAP, f"{what} is invalid: " + "; ".join(problems),
                              "see docs/hardware.md §5.4 for the cuTensorMapEncodeTiled rules")

    def driver_arguments(self, address: int) -> dict[str, Any]:
        """Keyword values for ``cuTensorMapEncodeTiled`` (innermost dimension first)."""
        return {
            "tensorDataType": int(self.dtype),
            "tensorRank": self.rank,
            "globalAddress": address,
            "globalDim": list(reversed(self.global_shape)),
            "globalStrides": list(reversed(self.global_strides[:-1])),
            "boxDim": list(reversed(self.box_shape)),
            "elementStrides": list(reversed(self.element_strides)),
            "interleave": int(self.interleave),
            "swizzle": int(self.swizzle),
            "l2Promotion": int(self.l2_promotion),
            "oobFill": int(self.oob_fill),
        }


@dataclass(frozen=True)
class TensorMap:
    """An encoded 128-byte map together with what it describes. Pass it as the argument of a
    tensor-map parameter to skip the launcher's own encoding; ``owner`` keeps the described
    memory alive."""

    spec: TensorMapSpec
    address: int
    data: bytes
    owner: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class TensorMapParam:
    """A ``tensor[dtype, rank]`` kernel parameter passed as a 128-byte ``__grid_constant__``
    tensor map (``.param .align 64 .b8 [128]``, docs/hardware.md §0 item 3 and §5.1). The caller
    passes an array (the launcher encodes a map for its layout with this box and options) or a
    prebuilt :class:`TensorMap`. With ``source`` set, the map is *derived*: not a caller
    argument, but built from the array passed for the pointer/array parameter ``source`` (after
    any host copy, so it describes device memory)."""

    name: str
    dtype: str
    box_shape: tuple[int, ...]
    swizzle: Swizzle = Swizzle.NONE
    interleave: Interleave = Interleave.NONE
    l2_promotion: L2Promotion = L2Promotion.NONE
    oob_fill: OobFill = OobFill.NONE
    element_strides: tuple[int, ...] | None = None
    readonly: bool = False
    source: str | None = None
    kind: ClassVar[str] = "tensormap"
    slot: ClassVar[tuple[int, int]] = (TENSOR_MAP_BYTES, TENSOR_MAP_ALIGN)

    @property
    def rank(self) -> int:
        return len(self.box_shape)

    def spec_for(self, info: ArrayInfo) -> TensorMapSpec:
        """The spec for an array argument (rank-checked: SP0720 on mismatch)."""
        if len(info.shape) != self.rank:
            raise LaunchError(ARG_SHAPE, f"argument `{self.name}` has rank {len(info.shape)}, but the "
                              f"kernel's tensor map is rank {self.rank} (box {self.box_shape})",
                              f"pass a rank-{self.rank} array")
        return TensorMapSpec.for_array(self.dtype, info.shape, info.strides, self.box_shape,
                                       element_strides=self.element_strides, swizzle=self.swizzle,
                                       interleave=self.interleave, l2_promotion=self.l2_promotion,
                                       oob_fill=self.oob_fill)


def encode_tensor_map(spec: TensorMapSpec, device_ptr: int, device: int | None = None) -> bytes:
    """Validate ``spec`` for ``device_ptr`` and encode it with ``cuTensorMapEncodeTiled``. This
    is host-side work but needs the CUDA driver and a current context (device ``device``'s
    primary context is made current); without a GPU it raises SP0716."""
    return make_tensor_map(spec, device_ptr, device=device).data


def driver_call_arguments(spec: TensorMapSpec, device_ptr: int) -> tuple[Any, ...]:
    """The positional arguments of ``cuTensorMapEncodeTiled`` with the cuda-python types it
    insists on (``cuuint64_t`` / ``cuuint32_t`` list items, enum members)."""
    from cuda.bindings import driver

    a = spec.driver_arguments(device_ptr)
    u64, u32 = driver.cuuint64_t, driver.cuuint32_t
    return (driver.CUtensorMapDataType(a["tensorDataType"]), a["tensorRank"], a["globalAddress"],
            [u64(v) for v in a["globalDim"]], [u64(v) for v in a["globalStrides"]],
            [u32(v) for v in a["boxDim"]], [u32(v) for v in a["elementStrides"]],
            driver.CUtensorMapInterleave(a["interleave"]), driver.CUtensorMapSwizzle(a["swizzle"]),
            driver.CUtensorMapL2promotion(a["l2Promotion"]), driver.CUtensorMapFloatOOBfill(a["oobFill"]))


def map_of(param_name: str) -> str:
    """How a diagnostic names the tensor map of launcher parameter ``param_name`` (``X.tmap0``, a map of
    ``tensor[...]`` argument ``X``): "the tensor map of argument `X`" (:meth:`TensorMapSpec.validate`'s
    ``what``)."""
    return f"the tensor map of argument `{param_name.split('.tmap')[0]}`"


def make_tensor_map(spec: TensorMapSpec, device_ptr: int, owner: Any = None, device: int | None = None,
                    validated: bool = False) -> TensorMap:
    """Like :func:`encode_tensor_map`, returning a :class:`TensorMap` value. ``validated``: the
    caller already validated ``spec`` for ``device_ptr`` (a prepared launch checks a layout once)."""
    import ctypes

    from cuda.bindings import driver

    from . import check, cudalib
    from .devices import context_of, device_state

    if not validated:
        spec.validate(device_ptr)
    with context_of(device_state(device)):  # (the thread's own context restored after)
        raw = cudalib.raw("cuTensorMapEncodeTiled")
        if raw is not None:
            return TensorMap(spec, device_ptr, _encode_raw(raw, spec, device_ptr), owner)
        tmap = check("cuTensorMapEncodeTiled",
                     driver.cuTensorMapEncodeTiled(*driver_call_arguments(spec, device_ptr)))
    return TensorMap(spec, device_ptr, ctypes.string_at(tmap.getPtr(), TENSOR_MAP_BYTES), owner)


def _encode_raw(encode: Any, spec: TensorMapSpec, device_ptr: int) -> bytes:
    """``cuTensorMapEncodeTiled`` through libcuda directly (``cudalib``): the argument arrays as
    ctypes arrays, the map written into a 64-byte aligned buffer (the CUtensorMap alignment)."""
    import ctypes

    from . import CudaError

    a = spec.driver_arguments(device_ptr)
    rank = a["tensorRank"]
    u64, u32 = ctypes.c_uint64, ctypes.c_uint32
    out = ctypes.create_string_buffer(TENSOR_MAP_BYTES + TENSOR_MAP_ALIGN)
    base = ctypes.addressof(out)
    aligned = base + (-base) % TENSOR_MAP_ALIGN
    strides = a["globalStrides"] or [0]
    err = encode(aligned, a["tensorDataType"], rank, device_ptr, (u64 * rank)(*a["globalDim"]),
                 (u64 * len(strides))(*strides), (u32 * rank)(*a["boxDim"]), (u32 * rank)(*a["elementStrides"]),
                 a["interleave"], a["swizzle"], a["l2Promotion"], a["oobFill"])
    if err:
        from cuda.bindings import driver

        raise CudaError("cuTensorMapEncodeTiled", driver.CUresult(err))
    return ctypes.string_at(aligned, TENSOR_MAP_BYTES)


class TensorMapCache:
    """A small LRU of encoded 128-byte maps. A map depends only on what it was encoded from (the
    address, shape, strides, element type, box, swizzle...), never on the memory's contents, so an
    entry keyed by all of those stays valid for as long as it is kept: the weight of a layer is
    encoded once and re-used by every launch that passes it. ``hits``/``misses`` count lookups."""

    def __init__(self, capacity: int = TENSOR_MAP_CACHE_SIZE):
        if capacity < 1:
            raise ValueError("a tensor-map cache holds at least one map")
        self.capacity = capacity
        self._entries: OrderedDict[Hashable, bytes] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def get(self, key: Hashable) -> bytes | None:
        """The map stored under ``key`` (now the most recently used), or None."""
        data = self._entries.get(key)
        if data is None:
            self.misses += 1
            return None
        self.hits += 1
        try:
            self._entries.move_to_end(key)
        except KeyError:  # evicted by another thread meanwhile: still a valid map
            pass
        return data

    def put(self, key: Hashable, data: bytes) -> bytes:
        """Store ``data`` under ``key``, evicting the least recently used map beyond capacity."""
        if len(data) != TENSOR_MAP_BYTES:
            raise ValueError(f"an encoded tensor map has {TENSOR_MAP_BYTES} bytes, got {len(data)}")
        self._entries[key] = data
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
        return data

    def clear(self) -> None:
        self._entries.clear()


def encoding_key(param: TensorMapParam) -> tuple[Any, ...]:
    """What a map of ``param`` depends on besides the array's address and layout."""
    return (param.dtype, param.box_shape, int(param.swizzle), int(param.interleave), int(param.l2_promotion),
            int(param.oob_fill), param.element_strides)


def layout_spec(param: TensorMapParam, shape: tuple[int, ...], strides: tuple[int, ...]) -> TensorMapSpec:
    """The spec of a map of ``param`` over an array of ``shape`` and element ``strides`` (rank
    checked: SP0720)."""
    if len(shape) != param.rank:
        raise LaunchError(ARG_SHAPE, f"argument `{param.name}` has rank {len(shape)}, but the kernel's tensor "
                          f"map is rank {param.rank} (box {param.box_shape})", f"pass a rank-{param.rank} array")
    return TensorMapSpec.for_array(param.dtype, tuple(shape), tuple(strides), param.box_shape,
                                   element_strides=param.element_strides, swizzle=param.swizzle,
                                   interleave=param.interleave, l2_promotion=param.l2_promotion,
                                   oob_fill=param.oob_fill)
