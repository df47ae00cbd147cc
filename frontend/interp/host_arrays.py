"""Host views of kernel arguments for the interpreter.

numpy arrays are used in place (a contiguous array is viewed flat; a strided one is copied and
written back). Other array objects (torch, cupy, jax) are converted to host arrays and written back
after the run when they are writable.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..diagnostics import LaunchError
from ..ir import types as T
from ..ir.core import Function
from .values import Buffer, PtrVal, TensorVal


def to_host(obj: Any) -> tuple[np.ndarray, Callable[[], None] | None]:
    """A numpy view or copy of ``obj``, and a function writing a copy back (None if a view)."""
    obj = getattr(obj, "sparsile_array", lambda: obj)()
    if isinstance(obj, np.ndarray):
        return obj, None
    mod = type(obj).__module__.split(".")[0]
    if mod == "torch":
        import torch

        t = obj
        if t.device.type == "cpu":
            if t.dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2):
                arr = _torch_special_to_numpy(t)

                def back() -> None:
                    t.copy_(_numpy_to_torch_special(arr, t.dtype))

                return arr, back
            return t.detach().numpy(), None
        host = t.detach().cpu()
        arr = _torch_special_to_numpy(host) if host.dtype in (torch.bfloat16, torch.float8_e4m3fn,
                                                              torch.float8_e5m2) else host.numpy()

        def back_dev() -> None:
            t.copy_(_numpy_to_torch_special(arr, t.dtype) if t.dtype in (torch.bfloat16, torch.float8_e4m3fn,
                                                                         torch.float8_e5m2)
                    else torch.from_numpy(arr))

        return arr, back_dev
    if mod == "cupy":
        arr = obj.get()

        def back_cp() -> None:
            obj.set(arr)

        return arr, back_cp
    arr = np.array(obj)
    return arr, None


def _torch_special_to_numpy(t: Any) -> np.ndarray:
    import ml_dtypes
    import torch

    view = {torch.bfloat16: (torch.int16, ml_dtypes.bfloat16),
            torch.float8_e4m3fn: (torch.int8, ml_dtypes.float8_e4m3fn),
            torch.float8_e5m2: (torch.int8, ml_dtypes.float8_e5m2)}[t.dtype]
    return t.contiguous().view(view[0]).numpy().view(view[1]).copy()


def _numpy_to_torch_special(a: np.ndarray, dtype: Any) -> Any:
    import torch

    ints = {torch.bfloat16: (np.int16, torch.int16), torch.float8_e4m3fn: (np.int8, torch.int8),
            torch.float8_e5m2: (np.int8, torch.int8)}[dtype]
    return torch.from_numpy(a.view(ints[0])).view(dtype)


def stored_params(func: Function) -> set[str]:
    """Names of pointer/tensor parameters the kernel may write (host copies are read back, and
    read-only arrays are refused)."""
    origin: dict[int, set[str]] = {}
    for p in func.runtime_params:
        if p.value is not None:
            origin[id(p.value)] = {p.name}
    written: set[str] = set()
    for op in func.walk():
        srcs: set[str] = set()
        for v in op.operands:
            srcs |= origin.get(id(v), set())
        if srcs and op.name != "load":
            for r in op.results:
                origin[id(r)] = srcs
        if op.name in ("store", "tensor.store_tile") or op.name.endswith(".store"):
            if op.operands:
                written |= origin.get(id(op.operands[0]), set())
    return written


def interpreter_params(func: Function, bound: dict[str, Any]) -> tuple[dict[str, Any], list[Callable[[], None]]]:
    """Interpreter values for each run-time parameter, and write-back callbacks. A read-only array
    passed to a parameter the kernel writes is LaunchError SP0719, as on the GPU."""
    params: dict[str, Any] = {}
    writeback: list[Callable[[], None]] = []
    written: set[str] | None = None
    for p in func.runtime_params:
        value = bound[p.name]
        t = p.type
        if isinstance(t, T.PointerType | T.TensorType):
            arr, back = to_host(value)
            if not arr.flags.writeable:
                written = stored_params(func) if written is None else written
                if p.name in written:
                    raise LaunchError("SP0719", f"argument `{p.name}` is a read-only array, but the kernel writes "
                                      "through it", help="pass a writable copy (e.g. `x.copy()`)")
            if back is not None:
                writeback.append(back)
            dt = T.numpy_dtype(t.elem if t.elem != T.tf32 else T.f32)
            if arr.dtype != dt:
                arr_conv = arr.astype(dt)
            else:
                arr_conv = arr
            if arr_conv.flags.c_contiguous and arr_conv is arr:
                flat = arr.reshape(-1)
                strides = tuple(s // arr.itemsize for s in arr.strides) if arr.ndim else ()
            else:
                flat = np.ascontiguousarray(arr_conv).reshape(-1)
                strides = tuple(s // flat.itemsize for s in np.ascontiguousarray(arr_conv).strides)

                def back_copy(dst: np.ndarray = arr, src: np.ndarray = flat) -> None:
                    dst[...] = src.reshape(dst.shape).astype(dst.dtype)

                if arr.flags.writeable:  # a read-only one is not written (checked above)
                    writeback.insert(0, back_copy)
            buf = Buffer(p.name, flat)
            if isinstance(t, T.TensorType):
                params[p.name] = TensorVal(buf, tuple(int(s) for s in arr.shape), strides)
            else:
                params[p.name] = PtrVal(buf, np.array(0, np.int64))
        else:
            assert isinstance(t, T.ScalarType)
            params[p.name] = np.array(value, dtype=T.numpy_dtype(t))
    return params, writeback
