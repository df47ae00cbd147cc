"""A minimal reader and writer of safetensors files, in Python and numpy (no dependency).

The format (https://huggingface.co/docs/safetensors): 8 bytes, the little-endian length N of a JSON
header; N bytes of JSON mapping each tensor name to ``{"dtype", "shape", "data_offsets": [begin,
end]}`` (offsets into the data that follows the header) and an optional ``"__metadata__"`` map of
strings; then the tensors' raw little-endian bytes, C order, without gaps. This writer pads the
header with spaces to a multiple of 8 bytes, as the reference implementation does.

bfloat16 and the float8 types are numpy arrays of ml_dtypes' ``bfloat16``, ``float8_e4m3fn`` and
``float8_e5m2``. Every malformed file is an :class:`~.errors.IntegrationError` SP0910 naming what
is wrong; an unknown dtype is SP0911.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from ..stdlib.sparsity.hostarray import as_host_array, plain_array
from .errors import SP_SAFETENSORS_DTYPE, SP_SAFETENSORS_FILE, IntegrationError

DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_), "U8": np.dtype(np.uint8), "I8": np.dtype(np.int8),
    "I16": np.dtype("<i2"), "I32": np.dtype("<i4"), "I64": np.dtype("<i8"),
    "F16": np.dtype("<f2"), "BF16": np.dtype(ml_dtypes.bfloat16), "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"), "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
}
"""safetensors dtype name -> numpy dtype (little-endian)."""

_NAMES = {dt: name for name, dt in DTYPES.items()}
MAX_HEADER = 100 * 1024 * 1024  # the reference implementation's limit
MAX_DIMS = 64  # numpy's limit on an array's dimensions (numpy >= 2)


def _file_error(path: Path, message: str, help: str = "rewrite the file with a safetensors writer") -> IntegrationError:
    return IntegrationError(SP_SAFETENSORS_FILE, f"{path.name}: {message}", help=help)


def dtype_name(dtype: np.dtype) -> str:
    """The safetensors name of numpy dtype ``dtype``; SP0911 for types the format has no name for."""
    dt = np.dtype(dtype)
    name = _NAMES.get(dt.newbyteorder("<") if dt.byteorder == ">" else dt)
    if name is None:
        raise IntegrationError(SP_SAFETENSORS_DTYPE, f"safetensors has no dtype for numpy {dt}",
                               help="convert to one of " + ", ".join(DTYPES))
    return name


def read_header(path: str | Path) -> tuple[dict[str, dict[str, Any]], dict[str, str], int]:
    """(tensors, metadata, data start) of a safetensors file, checked: every tensor's offsets lie
    inside the file and hold exactly its shape times its element size, and the tensors cover the
    data without overlaps or gaps."""
    path = Path(path)
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise _file_error(path, f"{size} bytes is too short for a safetensors file (8-byte header length)")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise _file_error(path, f"header length {n} exceeds the file ({size} bytes)")
        if n > MAX_HEADER:
            raise _file_error(path, f"header length {n} exceeds the limit of {MAX_HEADER} bytes")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:  # (json keeps the last value of a name: another tensor without a word)
        raise _file_error(path, f"the header names {exc.args[0]!r} twice") from None
    except ValueError as exc:  # (not UTF-8, not JSON, an integer of more than 4300 digits)
        raise _file_error(path, f"the header is not JSON: {exc}") from exc
    except RecursionError:  # (arrays nested thousands deep)
        raise _file_error(path, "the header is not JSON: nested too deeply") from None
    if not isinstance(header, dict):
        raise _file_error(path, "the header is not a JSON object")
    metadata = header.pop("__metadata__", None)
    metadata = {} if metadata is None else metadata  # ([] or "" is no map: not taken for an empty one)
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise _file_error(path, "__metadata__ must map names to strings")
    data_size = size - 8 - n
    for name, info in header.items():
        _check_entry(path, name, info, data_size)
    _check_tiling(path, header, data_size)
    return header, metadata, 8 + n


class _DuplicateKey(Exception):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict; _DuplicateKey for a name given twice."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _check_entry(path: Path, name: str, info: Any, data_size: int) -> None:
    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
        raise _file_error(path, f"tensor {name!r} lacks dtype, shape or data_offsets")
    if not isinstance(info["dtype"], str) or info["dtype"] not in DTYPES:
        raise IntegrationError(SP_SAFETENSORS_DTYPE, f"{path.name}: tensor {name!r} has dtype {info['dtype']!r}, "
                               "which this reader does not know", help="supported: " + ", ".join(DTYPES))
    shape, offsets = info["shape"], info["data_offsets"]
    if not (isinstance(shape, list) and all(_is_int(s) and s >= 0 for s in shape)):
        raise _file_error(path, f"tensor {name!r} has shape {shape!r}, not a list of sizes")
    if len(shape) > MAX_DIMS:
        raise _file_error(path, f"tensor {name!r} has {len(shape)} dimensions, more than numpy's {MAX_DIMS}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) for o in offsets)
            and 0 <= offsets[0] <= offsets[1] <= data_size):
        raise _file_error(path, f"tensor {name!r} has data_offsets {offsets!r} outside the {data_size} data bytes")
    want = math.prod(shape) * DTYPES[info["dtype"]].itemsize  # (Python ints: numpy's int64 product wraps)
    if offsets[1] - offsets[0] != want:
        raise _file_error(path, f"tensor {name!r} of shape {shape} {info['dtype']} needs {want} bytes, its offsets "
                          f"hold {offsets[1] - offsets[0]}")
    # numpy's limit on an array's bytes (zero sizes left out: the bytes above are 0, numpy still refuses
    # np.empty((0, 2**40, 2**40)) as "array is too big")
    if math.prod(s for s in shape if s) * DTYPES[info["dtype"]].itemsize > np.iinfo(np.intp).max:
        raise _file_error(path, f"tensor {name!r} has shape {shape}, larger than numpy can hold")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # (JSON true is not a size)


def _check_tiling(path: Path, header: dict[str, dict[str, Any]], data_size: int) -> None:
    """The tensors cover the data exactly, without overlaps or gaps, as the reference reader checks
    (overlapping tensors would read each other's bytes)."""
    end, last = 0, None
    for name, info in sorted(header.items(), key=lambda item: tuple(item[1]["data_offsets"])):
        begin, stop = info["data_offsets"]
        if begin < end:
            raise _file_error(path, f"tensor {name!r} has data_offsets {[begin, stop]}, which overlap those of "
                              f"tensor {last[0]!r} {last[1]}")
        if begin > end:
            raise _file_error(path, f"data bytes {end}..{begin} belong to no tensor")
        end, last = stop, (name, [begin, stop])
    if end != data_size:
        raise _file_error(path, f"data bytes {end}..{data_size} belong to no tensor")


def load_file(path: str | Path, names: set[str] | None = None) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file (those in ``names`` when given) as read-only numpy arrays
    mapped from the file."""
    path = Path(path)
    header, _, start = read_header(path)
    data = np.memmap(path, dtype=np.uint8, mode="r") if path.stat().st_size > start else np.empty(0, np.uint8)
    out = {}
    for name, info in header.items():
        if names is not None and name not in names:
            continue
        begin, end = info["data_offsets"]
        raw = data[start + begin:start + end]
        if info["dtype"] == "BOOL" and (np.asarray(raw) > 1).any():  # numpy would hold bools of 2..255
            raise _file_error(path, f"BOOL tensor {name!r} holds bytes other than 0 and 1",
                              "the file is damaged, or was written with another element type")
        out[name] = np.asarray(raw).view(DTYPES[info["dtype"]]).reshape(tuple(info["shape"]))
    return out


def _host_array(t: Any, what: str) -> np.ndarray:
    """Tensor ``t`` as :func:`save_file` writes it: a torch / cupy / JAX tensor (``__dlpack__``) as
    the toolkit reads it (:func:`~sparsile.stdlib.sparsity.hostarray.as_host_array`: bfloat16 and
    float8 kept, a tensor that requires grad or lives on a GPU copied), anything else as numpy's
    ``asanyarray`` of it, a plain array of native byte order (masked elements refused)."""
    if not isinstance(t, np.ndarray) and hasattr(t, "__dlpack__"):  # (np.asarray: torch's TypeError for bf16)
        return as_host_array(t, what)
    # (asanyarray keeps a masked array for plain_array to refuse: asarray dropped the mask, silently)
    return plain_array(np.asanyarray(t), what, "the file would hold the values under the mask")


def save_file(tensors: Mapping[str, Any], path: str | Path, metadata: Mapping[str, str] | None = None) -> None:
    """Write ``tensors`` (name -> numpy array, torch / cupy / JAX tensor, or anything numpy.asarray
    accepts) to ``path`` (through a ``.partial`` file renamed at the end, so that overwriting a file
    whose tensors are still mapped by :func:`load_file` is safe). Arrays are read as the toolkit
    reads them (:func:`_host_array`, :func:`~sparsile.stdlib.sparsity.hostarray.plain_array`): a
    subclass (``np.matrix``) as a plain array, a byte-swapped one by its values, a torch bfloat16
    tensor as bfloat16; a masked array with masked elements is SP0804 (the file would hold the
    values under the mask), before anything is written."""
    for name in tensors:  # (json.dumps writes 1 and "1" as one name; "__metadata__" is the metadata's key)
        if not isinstance(name, str):
            raise IntegrationError(SP_SAFETENSORS_FILE, f"tensor names must be strings, got {type(name).__name__} "
                                   f"{name!r}", help="name every tensor by a str")
        if name == "__metadata__":
            raise IntegrationError(SP_SAFETENSORS_FILE, "cannot write a tensor named '__metadata__' (the header's "
                                   "metadata key)", help="rename the tensor")
    arrays = {name: _host_array(t, f"tensors[{name!r}]") for name, t in tensors.items()}
    arrays = {name: a if a.flags.c_contiguous else a.copy(order="C") for name, a in arrays.items()}  # 0-d stays 0-d
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    for name, array in arrays.items():
        header[name] = {"dtype": dtype_name(array.dtype), "shape": list(array.shape),
                        "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    with partial.open("wb") as f:  # then renamed: arrays still mapped from the old file stay readable
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for array in arrays.values():
            little = array if array.dtype.byteorder != ">" else array.astype(array.dtype.newbyteorder("<"))
            f.write(little.tobytes())
    os.replace(partial, path)
