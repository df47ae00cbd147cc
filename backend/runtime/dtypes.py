"""The language's element types as the launcher sees them: size, class and scalar packing of
each, and the numpy (ml_dtypes) and torch dtypes that hold them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...frontend.diagnostics import InternalError


@dataclass(frozen=True)
class DTypeInfo:
    """One element type of the language: its size, class, numpy spelling and scalar packing
    (``struct`` format; bf16 is packed by hand)."""

    name: str
    bits: int
    category: str  # "int", "uint", "float", "bool"
    numpy_name: str
    struct_format: str

    @property
    def itemsize(self) -> int:
        return self.bits // 8


DTYPES: dict[str, DTypeInfo] = {d.name: d for d in (
    DTypeInfo("bool", 8, "bool", "bool", "<?"),
    DTypeInfo("i8", 8, "int", "int8", "<b"), DTypeInfo("u8", 8, "uint", "uint8", "<B"),
    DTypeInfo("i16", 16, "int", "int16", "<h"), DTypeInfo("u16", 16, "uint", "uint16", "<H"),
    DTypeInfo("i32", 32, "int", "int32", "<i"), DTypeInfo("u32", 32, "uint", "uint32", "<I"),
    DTypeInfo("i64", 64, "int", "int64", "<q"), DTypeInfo("u64", 64, "uint", "uint64", "<Q"),
    DTypeInfo("f16", 16, "float", "float16", "<e"), DTypeInfo("bf16", 16, "float", "bfloat16", "<H"),
    DTypeInfo("f32", 32, "float", "float32", "<f"), DTypeInfo("tf32", 32, "float", "float32", "<f"),
    DTypeInfo("f64", 64, "float", "float64", "<d"),
    DTypeInfo("e4m3", 8, "float", "float8_e4m3fn", "<B"), DTypeInfo("e5m2", 8, "float", "float8_e5m2", "<B"),
)}

ARRAY_DTYPE_ALIASES = {"tf32": "f32"}
"""tf32 values live in f32 storage, so a ``ptr[tf32]`` takes an f32 array."""

_NUMPY_NAMES = {d.numpy_name: d.name for d in DTYPES.values() if d.name != "tf32"}
_numpy_dtype_cache: dict[np.dtype, str | None] = {}


def dtype_info(name: str) -> DTypeInfo:
    try:
        return DTYPES[name]
    except KeyError:
        raise InternalError(f"unknown dtype {name!r} in a launcher parameter spec") from None


def numpy_dtype(name: str) -> np.dtype:
    """The host dtype holding values of ``name`` (ml_dtypes for bf16 and the 8-bit floats)."""
    info = dtype_info(name)
    if info.numpy_name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, info.numpy_name))
    return np.dtype(info.numpy_name)


def byte_swapped(dtype: np.dtype) -> bool:
    """Whether ``dtype``'s values are stored in the other byte order than the machine's (a plain
    multi-byte dtype, ``dtype('>f4')``; structured ones are copied as they are)."""
    return not (dtype.isnative or dtype.itemsize == 1 or dtype.names is not None)


def native_dtype(dtype: np.dtype) -> np.dtype:
    """``dtype`` in the machine's byte order (``dtype('>f2')`` -> ``dtype('float16')``); itself where
    it is not :func:`byte_swapped`."""
    return dtype.newbyteorder("=") if byte_swapped(dtype) else dtype


def native_order(array: np.ndarray) -> np.ndarray:
    """``array`` itself where it is in the machine's byte order, else a copy of its values converted
    to it (what a device, which reads the machine's order, must be given)."""
    return array.astype(native_dtype(array.dtype)) if byte_swapped(array.dtype) else array


def dtype_from_numpy(dt: np.dtype) -> str | None:
    """The language dtype of a numpy (or ml_dtypes) dtype, or None."""
    try:
        return _numpy_dtype_cache[dt]
    except KeyError:
        pass
    dt = np.dtype(dt)
    name = _NUMPY_NAMES.get(dt.name) if dt.isnative or dt.itemsize == 1 else None
    _numpy_dtype_cache[dt] = name
    return name


_TORCH_NAMES = {"torch.float32": "f32", "torch.float16": "f16", "torch.bfloat16": "bf16",
                "torch.float64": "f64", "torch.int8": "i8", "torch.uint8": "u8", "torch.int16": "i16",
                "torch.uint16": "u16", "torch.int32": "i32", "torch.uint32": "u32", "torch.int64": "i64",
                "torch.uint64": "u64", "torch.bool": "bool", "torch.float8_e4m3fn": "e4m3",
                "torch.float8_e5m2": "e5m2"}
_torch_dtype_cache: dict[Any, tuple[str | None, str]] = {}


def torch_dtype_info(torch_dtype: Any) -> tuple[str | None, str]:
    """``(language dtype or None, readable label)`` of a torch dtype, cached."""
    try:
        return _torch_dtype_cache[torch_dtype]
    except KeyError:
        text = str(torch_dtype)
        entry = _torch_dtype_cache[torch_dtype] = (_TORCH_NAMES.get(text), text.removeprefix("torch."))
        return entry


def dtype_from_torch(torch_dtype: Any) -> str | None:
    """The language dtype of a torch dtype (by its ``str``, so torch need not be imported)."""
    return torch_dtype_info(torch_dtype)[0]


def array_dtype_matches(param_dtype: str, array_dtype: str | None) -> bool:
    return array_dtype == ARRAY_DTYPE_ALIASES.get(param_dtype, param_dtype)
