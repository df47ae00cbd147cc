"""Host views of kernel arguments for the interpreter.

numpy arrays are used in place (a contiguous array is viewed flat; a strided one is copied and
written back; a subclass such as ``np.matrix`` through a plain view of its memory; a byte-swapped
one through a copy in the machine's byte order, written back converted). torch CPU tensors are
used in place (bfloat16 and float8 ones through an ml_dtypes view of their memory, so that a numpy
view of the same memory is the same view, as on the GPU path; a lazy negation such as
``torch._neg_view(t)`` through a copy with the negation applied: the GPU launch refuses it, SP0751);
other torch tensors and cupy arrays are converted to host arrays and written back after the run
when the kernel writes them. Host memory another library exports through DLPack (of an element
type numpy lacks too: :mod:`.dlpack_host`), or describes through ``__array_interface__`` /
``__array_struct__``, is viewed in place, as the GPU path stages it. Any other array object (a JAX array; one with only
``__array__``) is read through a read-only host copy: nothing could write it back, so a kernel
writing it is refused (SP0719, an ``__array__`` object in the GPU path's words:
:func:`array_copy_written`); an object with no array protocol at all is SP0708, in the GPU
launcher's words.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..diagnostics import LaunchError
from ..ir import types as T
from ..ir.core import Function, Operation
from ..ir.scalar_range import check_float_fits
from .dlpack_host import dlpack_host_view, exported_copy_written, exports_copy
from .overlap import UNDECIDED, UNDECIDED_REASON, self_overlap
from .values import Buffer, PtrVal, TensorVal


def to_host(obj: Any) -> tuple[np.ndarray, Callable[[], None] | None]:
    """A numpy view or copy of ``obj``, and a function writing a copy back (None if a view)."""
    obj = getattr(obj, "sparsile_array", lambda: obj)()
    if isinstance(obj, np.ndarray):  # (a subclass, np.matrix or np.memmap, viewed as a plain array of its memory)
        return (obj if type(obj) is np.ndarray else obj.view(np.ndarray)), None
    mod = type(obj).__module__.split(".")[0]
    if mod == "torch":
        import torch

        t = obj
        if t.is_neg() or t.is_conj():  # a lazy negation: its memory holds the values before it
            return _resolved_copy(t)
        if t.device.type == "cpu":
            if t.dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2):
                return torch_special_view(t), None
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
    exported = dlpack_host_view(obj)
    if exported is not None:  # host memory of another library: used in place, as the GPU path stages it
        return exported, None
    if has_memory_interface(type(obj)) and not is_jax_array(obj):  # its memory, in place, as on the GPU
        return np.asarray(obj), None
    arr = np.array(obj)  # (a JAX array: immutable; an ``__array__``: maybe a copy) read-only: written, SP0719
    arr.setflags(write=False)
    return arr, None


def has_memory_interface(cls: type) -> bool:
    """Whether instances of ``cls`` describe their host memory to numpy (``__array_interface__`` or
    ``__array_struct__``): both paths view that memory in place (the GPU path stages it by value and
    copies the results back into it: backend/runtime/arrays.py), read-only where the interface says so."""
    return hasattr(cls, "__array_interface__") or hasattr(cls, "__array_struct__")


def array_copy_written(name: str, type_name: str) -> LaunchError:
    """SP0719 for an object read through its ``__array__`` (no buffer, DLPack or array interface: what
    ``__array__`` returns may be a copy, so nothing could write the results back) passed for parameter
    ``name``, which the kernel writes: the words of both paths (backend/runtime/arrays.py)."""
    return LaunchError("SP0719", f"argument `{name}` (a {type_name}) is read through its __array__, a host copy "
                       "that cannot be written back, but the kernel writes through it",
                       help="pass a numpy array or a torch tensor (e.g. `np.array(x)`) and read the results from it")


def _resolved_copy(t: Any) -> tuple[np.ndarray, Callable[[], None]]:
    """A host copy of a torch tensor with its negative (or conjugate) bit set, the negation applied (the
    interpreter reads arrays it cannot use in place through a copy), and the write-back into the view
    (torch negates what is copied into it, so the view reads what the kernel wrote)."""
    import torch

    host = t.detach().resolve_neg().resolve_conj().cpu()
    special = host.dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2)
    arr = _torch_special_to_numpy(host) if special else host.numpy().copy()

    def back() -> None:
        with torch.no_grad():
            t.copy_(_numpy_to_torch_special(arr, t.dtype) if special else torch.from_numpy(arr))

    return arr, back


def is_jax_array(obj: Any) -> bool:
    """Whether ``obj`` is a JAX array (``jax.Array``'s implementation lives in jaxlib)."""
    return type(obj).__module__.split(".")[0] in ("jax", "jaxlib")


def _is_foreign(obj: Any, arr: np.ndarray) -> bool:
    """Whether to_host read ``obj`` through a copy ``arr`` it cannot write back (neither numpy, torch,
    cupy nor host memory exported through DLPack, which is viewed in place)."""
    obj = getattr(obj, "sparsile_array", lambda: obj)()
    return (not isinstance(obj, np.ndarray) and type(obj).__module__.split(".")[0] not in ("torch", "cupy")
            and arr.base is None)


def _memory_key(obj: Any) -> Any:
    """Which conversion of :func:`to_host` an argument shares: one per torch or cupy view of the same
    memory (``t`` and ``t[:]`` are two objects, one view: one copy, written back once, as the GPU
    shares the memory), else one per object."""
    obj = getattr(obj, "sparsile_array", lambda: obj)()
    mod = type(obj).__module__.split(".")[0]
    try:
        if mod == "torch":
            return ("torch", obj.data_ptr(), tuple(obj.shape), tuple(obj.stride()), obj.dtype, str(obj.device),
                    obj.is_neg())  # (a neg view and its base: one memory, two values)
        if mod == "cupy":
            return ("cupy", obj.data.ptr, tuple(obj.shape), tuple(obj.strides), str(obj.dtype), obj.device.id)
    except (AttributeError, RuntimeError, TypeError):  # (a sparse torch tensor has no data pointer)
        pass
    return ("object", id(obj))


def torch_special_view(t: Any) -> np.ndarray:
    """A numpy view (ml_dtypes) of a CPU torch bfloat16 or float8 tensor's memory, in its own shape
    and strides: used in place, as any CPU tensor is, so that it and a numpy view of the same memory
    are one view to the interpreter as to the GPU path (backend/runtime/arrays.py views its memory and
    host_groups.plan_host_groups gives both one device copy); a copy made them two, SP0750 with a write."""
    import ml_dtypes
    import torch

    view = {torch.bfloat16: (torch.int16, ml_dtypes.bfloat16),
            torch.float8_e4m3fn: (torch.int8, ml_dtypes.float8_e4m3fn),
            torch.float8_e5m2: (torch.int8, ml_dtypes.float8_e5m2)}[t.dtype]
    return t.detach().view(view[0]).numpy().view(view[1])


def _special_torch_view(value: Any) -> bool:
    """Whether ``value`` is a CPU torch bfloat16 or float8 tensor (:func:`torch_special_view`). It is
    used in place, and shares its view with a numpy view of the same memory, but it overlaps other
    views as the copy it was read through before: memory shared in part with a write stays SP0750, as
    the GPU path refuses it (backend/runtime/host_groups.py)."""
    value = getattr(value, "sparsile_array", lambda: value)()
    if type(value).__module__.split(".")[0] != "torch":
        return False
    import torch

    return value.device.type == "cpu" and value.dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2)


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


def _terminator(block: Any) -> list[Any]:
    """Operands of a block's scf.yield / scf.condition (empty when it has none)."""
    last = block.ops[-1] if block.ops else None
    return list(last.operands) if last is not None and last.name in ("scf.yield", "scf.condition") else []


def _flow_edges(op: Operation) -> list[tuple[list[Any], list[Any]]]:
    """(sources, destinations), element by element, of the values structured control flow passes
    on: loop-carried values into block arguments and results, yields into results."""
    if op.name == "scf.for":
        body = op.regions[0].block
        carried = body.args[1:]
        return [(op.operand_group("init"), carried), (_terminator(body), carried), (_terminator(body), op.results)]
    if op.name == "scf.while":
        before, after = op.regions[0].block, op.regions[1].block
        forwarded = _terminator(before)[1:]
        return [(op.operands, before.args), (forwarded, after.args), (forwarded, op.results),
                (_terminator(after), before.args)]
    if op.name == "scf.if":
        return [(_terminator(r.block), op.results) for r in op.regions]
    if op.regions:  # anything else with regions: every input may reach every output (conservative)
        ins = list(op.operands) + [v for r in op.regions for v in _terminator(r.block)]
        outs = list(op.results) + [a for r in op.regions for a in r.block.args]
        return [([v], outs) for v in ins]
    if op.name == "load":  # a loaded value is data, not a pointer
        return []
    return [([v], list(op.results)) for v in op.operands]


STORED_OPERAND = {"store": "ptr", "tensor.store_tile": "tensor", "tma.store": "tensor", "smem.store": "buf",
                  "tmem.store": "ref", "atomic_rmw": "ptr", "atomic_cas": "ptr"}
"""The operand each storing op writes through, by op name (tests/test_named_operands.py checks that
every op named ``store``, ``*.store`` or ``atomic_*`` is here): an array only atomics update is
written too, so a host copy of it must be read back."""


def stored_params(func: Function) -> set[str]:
    """Names of pointer/tensor parameters the kernel may write (host copies are read back, and
    read-only arrays are refused).

    A value derived from a parameter (pointer arithmetic, selects, ...) keeps its origin; so do
    loop-carried values and the results of structured control flow (a pointer advanced in a loop,
    an ``if`` that picks a pointer), through the values their regions yield, until nothing changes.
    """
    origin: dict[int, frozenset[str]] = {}
    for p in func.runtime_params:
        if p.value is not None:
            origin[id(p.value)] = frozenset({p.name})
    ops = list(func.walk())
    edges: list[tuple[list[Any], list[Any]]] = []
    for op in ops:
        for srcs, dsts in _flow_edges(op):
            if op.name.startswith("scf.") and len(srcs) == len(dsts):
                edges += [([a], [b]) for a, b in zip(srcs, dsts, strict=True)]
            else:
                edges.append((srcs, dsts))
    changed = True
    while changed:
        changed = False
        for srcs, dsts in edges:
            names: frozenset[str] = frozenset().union(*(origin.get(id(v), frozenset()) for v in srcs))
            if not names:
                continue
            for d in dsts:
                old = origin.get(id(d), frozenset())
                if not names <= old:
                    origin[id(d)] = old | names
                    changed = True
    written: set[str] = set()
    for op in ops:
        if op.name in STORED_OPERAND:
            written |= origin.get(id(op.operand(STORED_OPERAND[op.name])), frozenset())
    return written


def _user_layout(value: Any, arr: np.ndarray, copied_by_to_host: bool
                 ) -> tuple[str, int, tuple[int, ...], tuple[int, ...], int]:
    """(memory space, address, shape, byte strides, itemsize) of the user's array ``value``: its
    own layout where :func:`to_host` converted it (a torch or cupy array), ``arr``'s otherwise."""
    if copied_by_to_host:
        value = getattr(value, "sparsile_array", lambda: value)()
        if type(value).__module__.split(".")[0] == "torch":
            item = value.element_size()
            return (str(value.device), value.data_ptr(), tuple(value.shape),
                    tuple(st * item for st in value.stride()), item)
        return (f"cuda:{value.device.id}", value.data.ptr, tuple(value.shape), tuple(value.strides),  # cupy
                value.itemsize)
    return "cpu", arr.__array_interface__["data"][0], arr.shape, arr.strides, arr.itemsize


def _byte_span(layout: tuple[str, int, tuple[int, ...], tuple[int, ...], int]) -> tuple[str, int, int]:
    """(memory space, first byte, one past the last byte) an array of :func:`_user_layout` spans."""
    space, ptr, shape, steps, size = layout
    if any(n == 0 for n in shape):
        return space, ptr, ptr
    lo = ptr + sum(min(0, (n - 1) * st) for n, st in zip(shape, steps, strict=True))
    hi = ptr + sum(max(0, (n - 1) * st) for n, st in zip(shape, steps, strict=True)) + size
    return space, lo, hi


def _overlap(a: _HostArg, b: _HostArg) -> bool:
    """Whether two arguments' user arrays share memory."""
    if a.back is None and b.back is None:  # both numpy memory: exact
        try:
            return bool(np.shares_memory(a.arr, b.arr, max_work=100_000))
        except np.exceptions.TooHardError:
            return True
    sa, sb = a.span, b.span
    return sa[0] == sb[0] and sa[1] < sb[2] and sb[1] < sa[2]


class _HostArg:
    """One pointer/tensor argument on the host: the user's array as numpy (``arr``, with ``back``
    copying it to the user's object when to_host had to copy), and what the kernel sees."""

    def __init__(self, name: str, value: Any, arr: np.ndarray, back: Callable[[], None] | None, dt: np.dtype,
                 writes: bool):
        self.name, self.arr, self.back, self.writes, self.dt = name, arr, back, writes, dt
        self.copied = (back is not None or arr.dtype != dt or not arr.flags.c_contiguous
                       or _special_torch_view(value))
        self.view_key = (arr.__array_interface__["data"][0], arr.shape, arr.strides, arr.dtype, dt,
                         id(arr) if back is not None else 0)
        self.layout = _user_layout(value, arr, back is not None)
        self.span = _byte_span(self.layout)


def _check_self_overlap(a: _HostArg) -> None:
    """A written array whose own elements share memory runs on a dense copy, and the copy back
    keeps one of the values written to each shared address, silently (torch's ``copy_`` back into
    a tensor it converted raises instead, after the run): LaunchError SP0750. The user's array's
    own layout is checked (a torch bfloat16 or negated tensor reaches the kernel as a dense copy)."""
    _, _, shape, strides, itemsize = a.layout
    verdict = self_overlap(shape, strides, itemsize) if a.writes and a.copied else None
    if verdict is not None:
        why = (f": {UNDECIDED_REASON}" if verdict == UNDECIDED else "; the interpreter runs on a copy, and copying it "
               "back would keep only one of the values written to each shared address")
        raise LaunchError("SP0750", f"elements of argument `{a.name}` {verdict} in memory (shape {shape}, byte "
                          f"strides {strides}), and the kernel writes through it{why}",
                          help="pass an array whose elements are distinct (e.g. `out.copy()`, or a slice of a new "
                               "array)")


def _check_overlaps(args: list[_HostArg]) -> None:
    """Two arguments that share memory, at least one of them written, must be the identical view
    (they then share one host copy) or both be used in place; otherwise a copy would hide one's
    writes from the other: LaunchError SP0750."""
    for a in args:
        _check_self_overlap(a)
    for i, a in enumerate(args):
        for b in args[i + 1:]:
            if (a.writes or b.writes) and a.view_key != b.view_key and (a.copied or b.copied) and _overlap(a, b):
                raise LaunchError("SP0750", f"arguments `{a.name}` and `{b.name}` overlap in memory but are "
                                  "different views, and the kernel writes through "
                                  f"`{a.name if a.writes else b.name}`; the interpreter runs on a copy of "
                                  "non-contiguous (or converted) arrays, so the writes would be lost",
                                  help="pass the same array for both (aliasing the identical view works), "
                                       "or separate arrays (e.g. `y.copy()`)")


def interpreter_params(func: Function, bound: dict[str, Any]) -> tuple[dict[str, Any], list[Callable[[], None]]]:
    """Interpreter values for each run-time parameter, and write-back callbacks. A read-only array
    passed to a parameter the kernel writes is LaunchError SP0719, as on the GPU.

    Only what the kernel writes is written back (a copy of a non-contiguous or converted array,
    then the user's object when it is not numpy). Arguments that are the identical view of the
    same memory share one copy, so ``out=x`` works whatever x's strides; arguments that overlap
    otherwise, one of them written, through a copy, are LaunchError SP0750.
    """
    params: dict[str, Any] = {}
    written = stored_params(func)
    hosts: dict[Any, tuple[np.ndarray, Callable[[], None] | None]] = {}
    args: list[_HostArg] = []
    for p in func.runtime_params:
        value = bound[p.name]
        t = p.type
        if not isinstance(t, T.PointerType | T.TensorType):
            assert isinstance(t, T.ScalarType)
            if t.is_float and not isinstance(value, bool | np.bool_):
                check_float_fits(p.name, value, t.name)  # (specialized once per int bit length: check each call)
            params[p.name] = np.array(value, dtype=T.numpy_dtype(t))
            continue
        key = _memory_key(value)
        if key not in hosts:  # the same object, or the same torch / cupy view, converted once
            hosts[key] = to_host(value)
        arr, back = hosts[key]
        if arr.dtype == object:  # (np.array of an object with no array protocol: a 0-d object array)
            raise LaunchError("SP0708", f"argument `{p.name}` expects an array (pointer to "
                              f"{t.elem}), got {type(value).__name__}",
                              help="pass a numpy array, a CUDA tensor/array (torch, CuPy, JAX) or a DeviceBuffer")
        if not arr.flags.writeable and p.name in written:
            if not isinstance(value, np.ndarray) and hasattr(value, "__dlpack__") and exports_copy(value):
                raise exported_copy_written(p.name, type(value).__name__)
            if _is_foreign(value, arr) and not is_jax_array(value):
                raise array_copy_written(p.name, type(value).__name__)
            if _is_foreign(value, arr):
                raise LaunchError("SP0719", f"argument `{p.name}` is a read-only {type(value).__name__} (the "
                                  "interpreter reads it through a host copy it cannot write back), but the kernel "
                                  "writes through it", help="pass a numpy array or a torch tensor (e.g. "
                                  "`np.array(x)`), or call the kernel through sparsile.jax.call, whose outputs JAX "
                                  "allocates")
            raise LaunchError("SP0719", f"argument `{p.name}` is a read-only array, but the kernel writes "
                              "through it", help="pass a writable copy (e.g. `x.copy()`)")
        args.append(_HostArg(p.name, value, arr, back, T.numpy_dtype(t.elem if t.elem != T.tf32 else T.f32),
                             p.name in written))
    _check_overlaps(args)
    views: dict[tuple[Any, ...], tuple[np.ndarray, tuple[int, ...]]] = {}
    writable: dict[tuple[Any, ...], np.ndarray] = {}  # a writable array of each view, where one was passed:
    for a in args:  # identical views share the memory, and a read-only twin must not be the one written
        if a.arr.flags.writeable:
            writable.setdefault(a.view_key, a.arr)
    copies_back: dict[tuple[Any, ...], Callable[[], None]] = {}
    objects_back: dict[int, Callable[[], None]] = {}
    pointer_params = [p for p in func.runtime_params if isinstance(p.type, T.PointerType | T.TensorType)]
    for a, p in zip(args, pointer_params, strict=True):
        arr, dt = a.arr, a.dt
        in_place = arr.dtype == dt and arr.flags.c_contiguous
        if a.view_key not in views:
            if in_place:
                flat = writable.get(a.view_key, arr).reshape(-1)
                strides = tuple(s // arr.itemsize for s in arr.strides) if arr.ndim else ()
            else:
                dense = np.ascontiguousarray(arr.astype(dt, copy=False))
                flat = dense.reshape(-1)
                strides = tuple(s // flat.itemsize for s in dense.strides)
            views[a.view_key] = (flat, strides)
        flat, strides = views[a.view_key]
        buf = Buffer(p.name, flat)  # identical views share ``flat``, so each sees the other's writes
        if a.writes:
            if not in_place and a.view_key not in copies_back:
                def back_copy(dst: np.ndarray = arr, src: np.ndarray = flat) -> None:
                    dst[...] = src.reshape(dst.shape).astype(dst.dtype)

                copies_back[a.view_key] = back_copy
            if a.back is not None:
                objects_back[id(arr)] = a.back
        if isinstance(p.type, T.TensorType):
            params[p.name] = TensorVal(buf, tuple(int(s) for s in arr.shape), strides,
                                       caller_strides=tuple(int(s) for s in arr.strides)
                                       if arr.ndim and arr.dtype == dt else None)  # a cast is a dense copy
        else:
            params[p.name] = PtrVal(buf, np.array(0, np.int64))
    return params, [*copies_back.values(), *objects_back.values()]
