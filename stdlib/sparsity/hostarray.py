"""Turning user inputs (numpy, torch, cupy, anything with ``__dlpack__``) into host numpy arrays.

Order of attempts: a numpy array is used as is; an object with ``__dlpack__`` goes through
:func:`numpy.from_dlpack`; when numpy refuses (a CUDA tensor, or a dtype DLPack-in-numpy does not
know such as bfloat16 or float8), a torch-like object is copied with ``.cpu()`` and a cupy-like one
with ``.get()``; torch's bfloat16/float8 tensors are reinterpreted through an integer view and
re-tagged with the matching ml_dtypes type; other objects (a JAX bfloat16 or float8 array) go
through their ``__array__``. Anything else goes through :func:`numpy.asarray`.

Whatever the route, the result is a plain ``numpy.ndarray`` in the machine's byte order
(:func:`plain_array`): a subclass (``np.matrix``, ``np.memmap``) is viewed as one, a byte-swapped
array (``dtype('>f2')``) is converted (the toolkit reads raw bits: words or values of the other byte
order would be other numbers), and a masked array with masked elements is refused (SP0804: the
toolkit would read the values under the mask).
"""

from __future__ import annotations

import numbers
import sys
from typing import Any

import ml_dtypes
import numpy as np

from .errors import SP_BAD_INPUT, SparsityError

_DLPACK_REFUSALS = (BufferError, TypeError, RuntimeError, ValueError, AttributeError, NotImplementedError)

# torch dtype name -> (same-size torch integer dtype attribute, ml_dtypes host type)
_TORCH_REINTERPRET = {
    "torch.bfloat16": ("int16", ml_dtypes.bfloat16),
    "torch.float8_e4m3fn": ("uint8", ml_dtypes.float8_e4m3fn),
    "torch.float8_e5m2": ("uint8", ml_dtypes.float8_e5m2),
}


def _from_dlpack(obj: Any) -> np.ndarray | None:
    try:
        return np.from_dlpack(obj)
    except _DLPACK_REFUSALS:
        return None


def _torch_to_numpy(tensor: Any) -> np.ndarray | None:
    """A host copy of a torch-like tensor (``.cpu()``), reinterpreting dtypes numpy lacks."""
    host = tensor.detach() if hasattr(tensor, "detach") else tensor
    host = host.cpu()
    special = _TORCH_REINTERPRET.get(str(getattr(host, "dtype", "")))
    if special is not None:
        torch = sys.modules.get("torch")
        int_name, host_type = special
        int_dtype = getattr(torch, int_name, None) if torch is not None else None
        if int_dtype is not None and hasattr(host, "view"):
            as_int = host.view(int_dtype)
            array = _from_dlpack(as_int)
            if array is None and hasattr(as_int, "numpy"):
                array = as_int.numpy()
            if array is not None:
                return np.asarray(array).view(host_type)
    array = _from_dlpack(host)
    if array is None and hasattr(host, "numpy"):
        array = np.asarray(host.numpy())
    return array


def plain_array(array: np.ndarray, what: str = "input",
                consequence: str = "the computation would read the values under the mask") -> np.ndarray:
    """``array`` as a plain ``numpy.ndarray`` of native byte order: a view of a subclass's memory
    (``np.matrix``, ``np.memmap``; a masked array's data when no element is masked), a native copy
    of a byte-swapped array, ``array`` itself otherwise. SP0804 for a masked array with masked
    elements: nothing here honours a mask, so its values would be read as if unmasked
    (``consequence`` says what that would do, after the count of masked elements)."""
    if type(array) is not np.ndarray:
        if isinstance(array, np.ma.MaskedArray) and np.ma.is_masked(array):
            count = int(np.ma.count_masked(array))
            raise SparsityError(SP_BAD_INPUT, f"{what} is a masked array with {count} masked elements; "
                                f"{consequence}",
                                help=f"pass {what}.filled(value) (e.g. 0) for the masked elements, or "
                                     f"{what}.data to use the values under the mask")
        array = array.view(np.ndarray)
    if not array.dtype.isnative and array.dtype.itemsize > 1:
        array = array.astype(array.dtype.newbyteorder("="))
    return array


def as_host_array(x: Any, what: str = "input") -> np.ndarray:
    """``x`` as a numpy array in host memory (a view where possible, a copy for device data).

    Accepts numpy arrays, DLPack producers (torch, cupy, jax), torch CUDA tensors (through
    ``.cpu()``), cupy arrays (through ``.get()``) and nested sequences. Raises SP0804 when none of
    these work. The result is a plain ndarray of native byte order (:func:`plain_array`).
    """
    if isinstance(x, np.ndarray):
        return plain_array(x, what)
    if hasattr(x, "__dlpack__"):
        if getattr(x, "is_neg", None) is not None and (x.is_neg() or x.is_conj()):
            x = x.resolve_neg().resolve_conj()  # torch exports a lazy negation's memory without the negation
        array = _from_dlpack(x)
        if array is None and hasattr(x, "cpu"):
            try:
                array = _torch_to_numpy(x)
            except _DLPACK_REFUSALS:
                array = None
        if array is None and hasattr(x, "get"):
            try:
                array = np.asarray(x.get())
            except _DLPACK_REFUSALS:
                array = None
        if array is None and hasattr(type(x), "__array__"):  # a JAX bfloat16 / float8 array (ml_dtypes)
            try:
                array = np.asarray(x)
            except _DLPACK_REFUSALS:
                array = None
            if array is not None and array.dtype == object:
                array = None
        if array is None:
            raise SparsityError(
                SP_BAD_INPUT,
                f"cannot read {what} of type {type(x).__name__} on the host: numpy.from_dlpack refused "
                "it and it has no working .cpu() or .get()",
                help="pass a numpy array, or copy the tensor to host memory first",
            )
        return plain_array(array, what)
    try:
        array = np.asarray(x)
    except (TypeError, ValueError) as exc:
        raise SparsityError(SP_BAD_INPUT, f"cannot turn {what} of type {type(x).__name__} into an array: {exc}",
                            help="pass a numpy array, a torch/cupy tensor or a nested list of numbers") from exc
    if array.dtype == object:
        raise SparsityError(SP_BAD_INPUT, f"{what} is not a numeric array (element type object)",
                            help="pass a numpy array of numbers")
    return plain_array(array, what)


def checked_size(value: Any, what: str) -> int:
    """``value`` (a size or index such as m, k, a row) as a non-negative int, else SP0804."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 0:
        return int(value)
    raise SparsityError(SP_BAD_INPUT, f"{what} must be a non-negative integer, got {value!r}",
                        help=f"pass {what} as an int (the operand's logical, unpadded size)")


def checked_flag(value: Any, what: str) -> bool:
    """``value`` of a yes/no option (a bool, numpy's included) as a bool, else SP0804: a truthy
    string such as "no" would otherwise turn it on."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise SparsityError(SP_BAD_INPUT, f"{what} must be True or False, got {value!r}", help=f"pass {what}=True or False")


def complex_refusal(what: str, type_name: str) -> SparsityError:
    """SP0804 for ``what``, an array of complex element type ``type_name`` ("complex64"): the one
    wording of every path that refuses complex numbers (the kernels' operands, the toolkit's inputs)."""
    return SparsityError(SP_BAD_INPUT, f"{what} has element type {type_name}: the sparse GEMM multiplies real "
                         "numbers (the imaginary parts would be dropped)",
                         help=f"pass {what}.real, or the real and imaginary parts in two calls")


def bool_refusal(what: str) -> SparsityError:
    """SP0804 for ``what``, a bool array given as an operand of the sparse product: the one wording of
    ``sparse_matmul`` (stdlib/kernels/arrays.py ``check_real_operand``) and ``sparse_matmul_reference``."""
    return SparsityError(SP_BAD_INPUT, f"{what} is a bool array: the sparse GEMM multiplies numbers, and its bools "
                         "would be cast to 0 and 1 (numpy's matmul of bools is a logical product, torch.mm refuses "
                         "bools)", help=f"cast it to the operand type first: {what}.astype(values.dtype) "
                                        f"(torch: {what}.to(values.dtype))")


def real_operand_refusal(type_name: str, what: str) -> SparsityError | None:
    """The SP0804 refusal of an operand ``what`` of the sparse product whose element type is named
    ``type_name`` ("bool", "complex64", "torch.bool"): bools (:func:`bool_refusal`) and complex numbers
    (:func:`complex_refusal`); None for any other type."""
    name = type_name.removeprefix("torch.")
    if name == "bool":
        return bool_refusal(what)
    if name.startswith("complex"):
        return complex_refusal(what, name)
    return None


def require_numeric(array: np.ndarray, what: str) -> None:
    """Raise SP0804 unless ``array`` holds real numbers (bool, int, float or an ml_dtypes float):
    complex numbers in :func:`complex_refusal`'s words, anything else (objects, strings) as not
    numeric."""
    kind = array.dtype.kind
    if kind in "biuf":
        return
    if kind == "c":
        raise complex_refusal(what, array.dtype.name)
    if kind == "V" and array.dtype.names is None and array.dtype.itemsize in (1, 2):
        try:
            ml_dtypes.finfo(array.dtype)
            return
        except (TypeError, ValueError):
            pass
    raise SparsityError(SP_BAD_INPUT, f"{what} has element type {array.dtype}, which is not numeric",
                        help="pass a real-valued array (float, int or an ml_dtypes float type)")

