"""Where the sparse kernels' arrays live and how their operands and outputs are made.

An array is of one of these kinds (:func:`array_kind`): "numpy" (host), "torch" (a CUDA tensor),
"torch-cpu", "cupy", or "other". A GPU array is used in place by a launch, anything else becomes a
host numpy array (:func:`placed_array`); the helpers here cast operands to a kernel's element type,
zero-pad their columns, view metadata words as uint32, copy host arrays to where another array
lives, and make output and empty arrays of the launch's kind. :func:`bad_input` is the
:class:`~sparsile.stdlib.sparsity.SparsityError` they (and the kernels' launchers) raise for bad
arguments.
"""

from __future__ import annotations

import contextlib
import contextvars
import numbers
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from ...backend.runtime.arrays import byte_range
from ...driver.recording import note_scratch
from ...frontend.interp.overlap import UNDECIDED, UNDECIDED_REASON, self_overlap
from ..sparsity import SparsityError, as_host_array, cast_to_operand
from ..sparsity.dtypes import operand_type
from ..sparsity.errors import SP_BAD_INPUT, SP_META_ELEMENT_TYPE
from ..sparsity.hostarray import real_operand_refusal, require_numeric

if TYPE_CHECKING:
    from .gemm_choice import KernelChoice

_INT_OF_SIZE = {1: "uint8", 2: "int16", 4: "int32"}
DLPACK_CUDA = 2
"""DLPack's ``kDLCUDA`` device type (frontend/dlpack.py ``DEVICE_CUDA``)."""


_KIND_OF_TYPE: dict[type, str] = {}
""":func:`array_kind` by type ("torch?" for torch's: their device decides), filled as types are met."""

HOST_TENSORS_AS_DEVICE: contextvars.ContextVar[bool] = contextvars.ContextVar("sparsile_host_tensors_as_device",
                                                                             default=False)
"""True inside :func:`host_tensors_as_device`."""


@contextlib.contextmanager
def host_tensors_as_device() -> Iterator[None]:
    """Within it, :func:`array_kind` takes a torch tensor of any device for a CUDA one ("torch"): a
    plan made on host tensors then holds them as a GPU plan holds its device tensors (used in
    place, no host copies of x or the output), so it names the launches, and the kernel
    specializations, that a plan made on the GPU names. For planning only (``sparsile.torch.warm_up``
    plans a GPU's first calls on the CPU: integrations/torch/first_call.py): nothing may be launched
    inside."""
    token = HOST_TENSORS_AS_DEVICE.set(True)
    try:
        yield
    finally:
        HOST_TENSORS_AS_DEVICE.reset(token)


def array_kind(x: Any) -> str:
    """"numpy", "torch" (a CUDA tensor), "torch-cpu" (any other device), "cupy" or "other"."""
    kind = _KIND_OF_TYPE.get(type(x))
    if kind is None:
        package = type(x).__module__.split(".")[0]
        kind = ("numpy" if isinstance(x, np.ndarray) else "torch?" if package == "torch"
                else "cupy" if package == "cupy" else "other")
        _KIND_OF_TYPE[type(x)] = kind
    if kind == "torch?":
        return "torch" if getattr(x, "is_cuda", False) is True or HOST_TENSORS_AS_DEVICE.get() else "torch-cpu"
    return kind


def cupy_device(x: Any) -> contextlib.AbstractContextManager[Any]:
    """A cupy array's device as cupy's current one for a block, for what is made or computed for it:
    cupy creates and computes on its current device, not its arrays' (and, without peer access,
    refuses an array of another), while a launch runs where its arrays live (docs/language.md,
    "Specialization and launching"). Nothing for other arrays."""
    return x.device if array_kind(x) == "cupy" else contextlib.nullcontext()


def plain_int(v: Any) -> Any:
    """``v`` as a Python int when it is an integer of another type (numpy's), else ``v`` itself (a
    bool or a float stays one, for the checks that refuse it)."""
    return int(v) if isinstance(v, numbers.Integral) and not isinstance(v, (bool, int)) else v


def bad_input(message: str, help: str | None = None, code: str = SP_BAD_INPUT) -> SparsityError:
    return SparsityError(code, message, help=help)


MAX_I32_ELEMENTS = 2 ** 31
"""Elements an array may have where a kernel indexes it with 32-bit offsets: the sm_90a kernels (and
the Blackwell layer's epilogue) store C, y and split-K partial sums through pointers at i32 offsets
of up to split x rows x columns - 1, which wrap beyond 2^31 - 1 (docs/language.md: integers wrap)."""


def check_i32_elements(shape: tuple[int, ...], what: str, help: str) -> None:
    """SP0804 where an array of ``shape`` that a kernel indexes with 32-bit element offsets has more
    than :data:`MAX_I32_ELEMENTS` elements: the offsets would wrap (a fault or a wrong result on the
    GPU, found by nothing before the launch)."""
    count = 1
    for s in shape:
        count *= int(s)
    if count > MAX_I32_ELEMENTS:
        raise bad_input(f"{what} of shape {tuple(int(s) for s in shape)} has {count} elements, beyond the 2^31 that "
                        "the kernel's 32-bit element offsets reach (they would wrap)", help=help)


def check_split_workspace(split: int, rows: int, cols: int, instead: str) -> None:
    """:func:`check_i32_elements` of a split-K plan's (split, rows, cols) partial sums (none for one
    split), with the largest split that fits; ``instead``: the other way out, for the help. An
    empty result (no rows or no columns) fits any split (and the help's division has no zero)."""
    if split > 1:
        fits = max(1, MAX_I32_ELEMENTS // max(1, rows * cols))
        check_i32_elements((split, rows, cols), "the split-K workspace", help=f"pass a smaller split_k (at most "
                           f"{fits} for a {rows} x {cols} result), or {instead}")


def check_split_k(split_k: Any) -> None:
    """SP0804 for an explicit ``split_k`` that no kernel takes (an integer from 1 to 64), also where
    the kernel planned does not split K (Blackwell) and would otherwise ignore it."""
    if split_k is not None and (not isinstance(split_k, int) or isinstance(split_k, bool) or not 1 <= split_k <= 64):
        raise bad_input(f"split_k must be an integer from 1 to 64, got {split_k!r}")


def placed_array(x: Any, what: str, interpret: bool) -> Any:
    """``x`` itself when it is a GPU array the launch can use in place (a torch row of any stride
    as a packed row, :func:`packed_row`; a torch neg view, ``torch._neg_view(x)``, as a copy with the
    negation applied: a launch reads memory, which holds the values before it), else a host numpy array."""
    kind = "numpy" if interpret else array_kind(x)
    if kind == "torch":
        return packed_row(x.resolve_neg() if x.is_neg() else x)
    if kind == "cupy":
        return x
    host = as_host_array(x, what)
    require_numeric(host, what)
    return host


def check_real_operand(x: Any, what: str) -> None:
    """SP0804 for a dense operand of bools or complex numbers (numpy, torch on any device, cupy; an
    object without a dtype, a list, is checked once placed). A bool array would be cast to 0 and 1
    and multiplied, where ``np.matmul`` of bools is a logical product and ``torch.mm`` refuses them;
    a complex one would lose its imaginary parts in the cast (torch and cupy only warn)."""
    dtype = getattr(x, "dtype", None)
    refusal = None if dtype is None else real_operand_refusal(str(dtype), what)
    if refusal is not None:
        raise refusal


def cast_operand(x: Any, choice: KernelChoice, what: str = "b") -> Any:
    """``x`` in the operand's element type (a no-op when it already is); a numpy array through
    ``cast_to_operand`` (e4m3 saturates at ±448 with a warning); a cupy array through
    :func:`~.operand_cast.cast_input`, on its device; a torch tensor by the same rules
    (:mod:`.operand_cast`: integer types refuse values they cannot hold, where torch wraps 300 to 44;
    float64 rounds once), except that e4m3 saturates without the count (a count would synchronize
    the device): :func:`~.operand_cast.to_e4m3_saturating`."""
    if array_kind(x) == "torch":
        import torch

        from .operand_cast import cast_input, to_e4m3_saturating

        want = getattr(torch, choice.torch_dtype)
        if x.dtype == want:
            return x
        if choice.operand == "e4m3":
            return to_e4m3_saturating(x, want)
        return cast_input(x, operand_type(choice.operand), want, "torch", what)
    host = operand_type(choice.operand).host_dtype
    if x.dtype == host:
        return x
    if array_kind(x) == "cupy" and choice.operand in ("bf16", "e4m3"):
        raise bad_input(f"cupy has no {choice.operand} arrays: cannot cast a {x.dtype} array to it",
                        help="pass torch tensors or numpy arrays (ml_dtypes) for bf16 and e4m3")
    if isinstance(x, np.ndarray):
        return cast_to_operand(x, operand_type(choice.operand), what)
    from .operand_cast import cast_input

    with cupy_device(x):  # (cupy: the host's rules too, SP0804 where an integer type cannot hold a value)
        return cast_input(x, operand_type(choice.operand), None, array_kind(x), what)


def pad_columns(x: Any, cols: int) -> Any:
    """``x`` (rows, k) C-contiguous, zero-extended to ``cols`` columns (zero bits are +0 for every type).
    Where no column is added, the strides are made those of a packed (rows, cols) array: numpy and
    torch count a single row of any row stride as contiguous (``x[1:2]`` of a wider array, a torch
    ``hidden[:, -1, :]``), and a tensor map built from that stride fails where it is not a multiple
    of 16 bytes (:func:`packed_row`)."""
    rows, have = x.shape
    if array_kind(x) == "torch":
        import torch

        if have == cols:
            return packed_row(x.contiguous())
        ints = getattr(torch, _INT_OF_SIZE[x.element_size()])
        padded = torch.zeros((rows, cols), dtype=ints, device=x.device)
        padded[:, :have] = x.view(ints)
        return padded.view(x.dtype)
    xp = np
    if array_kind(x) == "cupy":
        import cupy as xp
    with cupy_device(x):
        if have == cols:
            return xp.ascontiguousarray(x).reshape(-1).reshape(rows, cols)  # (a view: packed strides)
        padded = xp.zeros((rows, cols), dtype=x.dtype)
        padded[:, :have] = x
    return padded


def as_u32_words(meta: Any) -> Any:
    """Metadata words as C-contiguous uint32 (the kernel's ``ptr[u32]``), reinterpreting int32."""
    name = str(meta.dtype).removeprefix("torch.")
    if name not in ("int32", "uint32"):
        raise bad_input(f"metadata words must be 32-bit integers, got {meta.dtype}", code=SP_META_ELEMENT_TYPE,
                        help='encode them with encode_metadata(indices, "sm90", dtype)')
    if array_kind(meta) == "torch":
        import torch

        return meta.resolve_neg().contiguous().view(torch.uint32)  # (torch refuses to view a neg view as uint32)
    if array_kind(meta) == "cupy":
        import cupy

        with meta.device:  # (a copy of strided words: on their device)
            return cupy.ascontiguousarray(meta).view(cupy.uint32)
    return np.ascontiguousarray(meta).view(np.uint32)


def packed_row(x: Any) -> Any:
    """A torch (1, K) tensor with unit column stride as a view of row stride K. torch counts a single
    row of any row stride as contiguous (``hidden[:, -1, :]`` of a (1, S, K) tensor has stride S * K),
    and a tensor map built from that stride fails where it is not a multiple of 16 bytes
    (docs/hardware.md, TMA), though one row never uses it."""
    if len(x.shape) == 2 and x.shape[0] == 1 and x.stride(1) == 1 and x.stride(0) != x.shape[1]:
        return x.view(-1).view(1, -1)
    return x


def copy_like(host: np.ndarray, like: Any) -> Any:
    """A copy of host array ``host``, same element type, where ``like`` lives (its torch device, cupy)."""
    kind = array_kind(like)
    if kind in ("torch", "torch-cpu"):
        import torch

        if not host.dtype.isnative and host.itemsize > 1:  # (its bits viewed as integers: the values' bits)
            host = host.astype(host.dtype.newbyteorder("="))
        bits = np.ascontiguousarray(host).view(_INT_OF_SIZE[host.itemsize])
        if kind == "torch-cpu" or not bits.flags.writeable:  # .to(cpu) would alias host; torch needs writable
            bits = bits.copy()
        tensor = torch.from_numpy(bits).to(like.device)
        return tensor.view(getattr(torch, host.dtype.name))
    if kind == "cupy":
        import cupy

        with like.device:  # cupy allocates on its current device, not like's
            return cupy.asarray(host)
    return host


def device_span(x: Any) -> tuple[int, int] | None:
    """[first byte, last byte + 1) of the device memory a torch CUDA or cupy array covers (strides
    may be negative), or None for other arrays and empty ones."""
    kind = array_kind(x)
    if kind == "torch":
        item = x.element_size()
        span = byte_range(x.data_ptr(), x.shape, [st * item for st in x.stride()], item)
    elif kind == "cupy":
        span = byte_range(x.data.ptr, x.shape, x.strides, x.itemsize)
    else:
        return None
    return None if span[0] == span[1] else span


def device_ordinal(x: Any) -> int | None:
    """The CUDA device an array lives on (a torch CUDA tensor, a CuPy or JAX array: DLPack's
    ``__dlpack_device__``), or None for host memory, managed memory and non-arrays: a launch runs
    on the current device (``runtime.current_device()``) and stages host arrays there."""
    query = getattr(type(x), "__dlpack_device__", None)
    if query is None:
        return None
    try:
        kind, ordinal = query(x)
    except Exception:  # an array that cannot say (a torch tensor of a backend without DLPack)
        return None
    return int(ordinal) if int(kind) == DLPACK_CUDA else None


def host_span(x: Any) -> tuple[int, int] | None:
    """[first byte, last byte + 1) of the host memory a numpy array or a torch CPU tensor covers
    (the interpreter reads a torch CPU tensor's memory in place), or None for others and empty ones."""
    kind = array_kind(x)
    if kind == "numpy":
        span = byte_range(x.__array_interface__["data"][0], x.shape, x.strides, x.itemsize)
    elif kind == "torch-cpu" and str(x.device) == "cpu" and str(x.layout) == "torch.strided":
        item = x.element_size()
        span = byte_range(x.data_ptr(), x.shape, [st * item for st in x.stride()], item)
    else:
        return None
    return None if span[0] == span[1] else span


def overlaps(out: Any, *reads: Any) -> bool:
    """Whether device array ``out`` shares memory with any of ``reads``, or numpy array ``out`` with
    a numpy one or a torch CPU tensor (:func:`host_span`: the interpreter runs in place on them; a
    kernel writing out in place would read its own results: C is then written to a new array and
    copied into out)."""
    if isinstance(out, np.ndarray):
        span = host_span(out)
        return span is not None and any(
            other is not None and other[0] < span[1] and span[0] < other[1]
            for other in (host_span(r) for r in reads))
    span = device_span(out)
    if span is None:
        return False
    for r in reads:
        other = None if r is None else device_span(r)
        if other is not None and other[0] < span[1] and span[0] < other[1]:
            return True
    return False


def output_array(out: Any, shape: tuple[int, int], dtype: str, help: str, home: Any, interpret: bool,
                 reads: tuple[Any, ...] = ()) -> Any:
    """``out`` (checked: ``shape``, numpy dtype name ``dtype``, writable, no two elements sharing
    memory, no masked element; ``help`` names the rule) when the launch can write it in place, else a
    new array like :func:`empty_array` (also for a byte-swapped numpy out, ``dtype('>f2')``): also
    where out shares memory with ``home`` (b or x) or one of ``reads`` (the other operands), so that
    C is the product of the operands as they were passed."""
    if out is not None:
        have_shape = tuple(getattr(out, "shape", ()))
        have = str(getattr(out, "dtype", "")).removeprefix("torch.")
        if isinstance(out, np.ndarray) and not out.dtype.isnative:  # (">f2": C is copied in, converted)
            have = out.dtype.name
        if have_shape != shape or have != dtype:
            raise bad_input(f"out must be a {shape} {dtype} array, got {have_shape} {have or type(out)}", help=help)
        kind = array_kind(out)
        if kind == "numpy" and not out.flags.writeable:
            raise bad_input("out is a read-only array", help="pass a writable array, or leave out unset for a new one")
        if isinstance(out, np.ma.MaskedArray) and np.ma.is_masked(out):  # (C is written under the mask, hidden)
            raise bad_input(f"out is a masked array with {np.ma.count_masked(out)} masked elements: C would be "
                            "written under the mask and stay hidden", help="pass a plain array (or out.data), or "
                            "leave out unset for a new one")
        check_distinct_elements(out, have_shape)
        # (after the checks, which hold for any out: copy_ would convert or broadcast; numpy: the
        # interpreter runs in place too)
        if (not interpret or kind == "numpy") and overlaps(out, home, *reads):
            return empty_array(home, shape, dtype, interpret)  # deliver_result copies C into out
        if kind == "torch" and not interpret and out.is_contiguous() and not out.is_neg():
            return out  # (a neg view: C through a copy, which torch's copy_ writes through the negation)
        if kind in ("numpy", "cupy") and (kind == "numpy" or not interpret) and out.flags["C_CONTIGUOUS"] \
                and out.dtype.isnative:
            return out
    return empty_array(home, shape, dtype, interpret)


def _strides(array: Any) -> tuple[int, ...]:
    """Strides of a numpy, cupy (bytes) or torch (elements) array."""
    stride = getattr(array, "stride", None)  # (torch: a method; numpy and cupy: the strides attribute)
    return tuple(stride() if callable(stride) else array.strides)


def check_distinct_elements(out: Any, shape: tuple[int, ...]) -> None:
    """SP0804 where elements of ``out`` (numpy, torch, cupy) share memory: a zero stride, or rows or
    columns of a strided view that overlap. A copy of C into such an out keeps one of the results
    written to each shared address (numpy, torch's ``copy_`` and cupy alike), silently; a kernel
    writing it in place races."""
    kind = array_kind(out)
    if kind not in ("numpy", "torch", "torch-cpu", "cupy"):
        return
    if out.is_contiguous() if kind in ("torch", "torch-cpu") else out.flags["C_CONTIGUOUS"]:
        return  # (the common case: dense, so every element is distinct)
    strides = _strides(out)
    if any(n > 1 and st == 0 for n, st in zip(shape, strides)):
        # (numpy's copy into such a view keeps the last row or column for all of them, silently)
        raise bad_input(f"out has a zero stride (strides {tuple(strides)}): its rows or columns share memory",
                        help="pass an array with one element per result, or leave out unset for a new one")
    itemsize = out.element_size() if kind in ("torch", "torch-cpu") else out.itemsize
    byte_strides = tuple(st * itemsize for st in strides) if kind in ("torch", "torch-cpu") else strides
    verdict = self_overlap(shape, byte_strides, itemsize)
    if verdict is not None:
        why = UNDECIDED_REASON if verdict == UNDECIDED else ("C has one result per element, and a copy into out "
                                                              "would keep only one of those written to each "
                                                              "shared address")
        raise bad_input(f"out's elements {verdict} in memory (shape {tuple(shape)}, byte strides "
                        f"{tuple(byte_strides)}): {why}",
                        help="pass an array whose elements are distinct (a new array, or a slice of one)")


def empty_array(home: Any, shape: tuple[int, ...], dtype: str, interpret: bool) -> Any:
    """A new array of numpy dtype name ``dtype``: a torch/cupy array on ``home``'s device for a GPU
    launch, numpy otherwise. Noted as the call's scratch where its launches are being recorded
    (``driver/recording.py``)."""
    kind = "numpy" if interpret else array_kind(home)
    if kind == "torch":
        import torch

        array = torch.empty(shape, dtype=getattr(torch, dtype), device=home.device)
    elif kind == "cupy":
        import cupy

        with home.device:  # cupy allocates on its current device, not home's
            array = cupy.empty(shape, dtype=dtype)
    else:
        array = np.empty(shape, dtype=operand_type("bf16").host_dtype if dtype == "bfloat16" else dtype)
    return note_scratch(array)


def zeros_array(home: Any, shape: tuple[int, ...], dtype: str, interpret: bool) -> Any:
    """:func:`empty_array`, zero-filled (noted as zero-filled scratch: a replay allocates it zeroed)."""
    array = empty_array(home, shape, dtype, interpret)
    fill(array, 0)
    return note_scratch(array, zero=True)


def fill(array: Any, value: Any) -> None:
    """``array[...] = value``, for a cupy array on its own device (:func:`cupy_device`)."""
    with cupy_device(array):
        array[...] = value


def deliver_result(result: Any, out: Any, b: Any) -> Any:
    """Hand C back: in ``out`` (copied there if the kernel could not write it in place), else in b's
    kind (a host result becomes a torch tensor on b's device for torch b, a cupy array for cupy b)."""
    if out is not None:
        if result is not out:
            if array_kind(out) in ("torch", "torch-cpu"):
                out.copy_(result if array_kind(result) == "torch" else copy_like(result, out))
            elif array_kind(out) == "cupy":
                import cupy

                with out.device:  # (cupy copies on its current device)
                    out[...] = cupy.asarray(result)
            else:
                out[...] = as_host_array(result, "C")
        return out
    if array_kind(result) == "numpy" and array_kind(b) in ("torch", "torch-cpu", "cupy"):
        return copy_like(result, b)
    return result
