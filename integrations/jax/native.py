"""The native fast path of the CUDA ``sparsile_call`` handler: machine code JIT-compiled by llvmlite.

The Python handler (:mod:`.ffi`) takes the GIL and runs 100-200 µs of Python per call; with another
Python thread busy, each call also waits for the GIL (milliseconds). So the handler XLA calls on CUDA
is a native function, generated here as LLVM IR and compiled for the host by llvmlite's MCJIT (no C
compiler involved). Per call it

1. sends the metadata query (a frame whose extension chain starts with XLA_FFI_Extension_Metadata,
   once at registration) or a frame of a stage other than *execute* to the Python handler (the
   *slow path*);
2. finds the ``sparsile_plan`` int64 attribute and looks the plan up in an open-addressing table
   (plan id -> record, an int64 array) that Python fills;
3. when the plan's record is armed: asks XLA for the stream (``XLA_FFI_Stream_Get``) and the device
   (``XLA_FFI_DeviceOrdinal_Get``, which must be the record's), copies the
   record's pre-packed kernel parameters onto its own stack (so concurrent calls never share a
   buffer; ``cuLaunchKernel`` copies ``kernelParams`` before it returns), writes XLA's buffer
   addresses into the pointer slots (checking the 16-byte alignment a specialization assumed),
   re-encodes in that stack copy (``cuTensorMapEncodeTiled``) the TMA tensor map of every buffer
   that is not at the address the record's map was encoded for, builds the ``void*`` array on the
   stack and calls ``cuLaunchKernel`` (``cuLaunchKernelEx`` with the launch attributes of a cluster
   or of ``pdl=True``) from libcuda;
4. anything else (unknown plan, unarmed record, a misaligned buffer, a failing Stream_Get, encode
   or launch) goes to the Python handler, which does the whole call (and its diagnostics) and then
   arms the plan's record from a packing of the same arguments (:meth:`Launcher.snapshot`).

Records are immutable once published: arming builds a new one and stores its address into the
table with one aligned 8-byte store; old records stay alive for the process (a native call may still
read one). A launch failure on the fast path marks the record, and the Python handler then leaves
that plan on the slow path for good. Counters (fast calls, slow calls, fast-path launch failures)
are native atomics: :func:`counts`. ``SPARSILE_JAX_NATIVE=0`` turns all of this off (docs/jax.md).
Records, their launch (the IR from the parameter copy to the launch) and the libcuda entry points
are shared with the torch launch record: backend/runtime/native_launch.py.
"""

from __future__ import annotations

import ctypes as c
import os
import threading
import warnings
from collections.abc import Sequence
from typing import Any

from ...backend.runtime.native_launch import (
    G_ENCODE,
    G_FAILS,
    G_FAST,
    G_LAUNCH,
    G_LAUNCH_EX,
    G_MASK,
    G_SLOW,
    G_SLOWS,
    G_TABLE,
    G_WORDS,
    R_ERROR,
    R_ORDINAL,
    compile_ir,
    fill,
    launch_attributes,
    launch_config_constants,
    libcuda_entry_points,
    record_words,
    tmap_entry,
)
from . import ffi
from .native_ir import HANDLER_IR

ENV = "SPARSILE_JAX_NATIVE"
"""``SPARSILE_JAX_NATIVE=0``: the Python handler for every call (no native fast path)."""

TABLE_CAPACITY = 1 << 14
"""Slots of the plan table (a power of two); a plan that finds no free slot stays on the slow path."""


def enabled() -> bool:
    """Whether the native fast path is on (``SPARSILE_JAX_NATIVE`` is not "0")."""
    return os.environ.get(ENV, "1") != "0"


def _offset(struct: Any, *path: str) -> int:
    total, kind = 0, struct
    for name in path:
        field = getattr(kind, name)
        total += field.offset
        kind = dict(kind._fields_)[name]
    return total


def _constants() -> dict[str, int]:
    """Byte offsets of the call frame's fields (from :mod:`.ffi`'s structs, i.e. c_api.h) and the
    attribute name as two overlapping little-endian words."""
    name = ffi.PLAN_ATTRIBUTE.encode()
    assert len(name) == 13
    from ...backend.runtime.cudalib import LaunchConfig

    return {
        "EXT": _offset(ffi._CallFrame, "extension_start"), "API": _offset(ffi._CallFrame, "api"),
        "CTX": _offset(ffi._CallFrame, "ctx"), "STAGE": _offset(ffi._CallFrame, "stage"),
        "ARGS_N": _offset(ffi._CallFrame, "args", "size"), "ARGS_ITEMS": _offset(ffi._CallFrame, "args", "items"),
        "RETS_N": _offset(ffi._CallFrame, "rets", "size"), "RETS_ITEMS": _offset(ffi._CallFrame, "rets", "items"),
        "ATTR_N": _offset(ffi._CallFrame, "attrs", "size"), "ATTR_NAMES": _offset(ffi._CallFrame, "attrs", "names"),
        "ATTR_VALS": _offset(ffi._CallFrame, "attrs", "attrs"), "EXT_TYPE": _offset(ffi._ExtensionBase, "type"),
        "SCALAR_VALUE": _offset(ffi._Scalar, "value"), "DATA": _offset(ffi._Buffer, "data"),
        "STREAM_GET": _offset(ffi._Api, "Stream_Get"), "SG_SIZE": c.sizeof(ffi._StreamGetArgs),
        "ORDINAL_GET": _offset(ffi._Api, "DeviceOrdinal_Get"),
        "ORD_END": _offset(ffi._Api, "DeviceOrdinal_Get") + c.sizeof(c.c_void_p),
        "OG_SIZE": c.sizeof(ffi._OrdinalGetArgs), "OG_CTX": _offset(ffi._OrdinalGetArgs, "ctx"),
        "OG_ORDINAL": _offset(ffi._OrdinalGetArgs, "device_ordinal"),
        "SG_CTX": _offset(ffi._StreamGetArgs, "ctx"), "SG_STREAM": _offset(ffi._StreamGetArgs, "stream"),
        "NAME0": int.from_bytes(name[:8], "little"), "NAME1": int.from_bytes(name[5:13], "little"),
        "CFG_SIZE": c.sizeof(LaunchConfig), **launch_config_constants(),  # CFG_*, BLOCK_ATTRS
        "EXECUTE": ffi._STAGE_EXECUTE, "METADATA": ffi._EXTENSION_METADATA,
    }


def handler_ir(state: int) -> str:
    """The handler's LLVM IR with its placeholders filled in (``state``: the global state's address)."""
    return fill(HANDLER_IR, {**_constants(), "STATE": state})


class NativeHandler:
    """The compiled handler, its global state and plan table, and the records it was armed with."""

    def __init__(self, slow: int, launch: int, launch_ex: int, encode: int):
        self.state = (c.c_int64 * G_WORDS)()
        self.table = (c.c_int64 * (2 * TABLE_CAPACITY))()
        self.state[G_LAUNCH], self.state[G_LAUNCH_EX], self.state[G_SLOW] = launch, launch_ex, slow
        self.state[G_TABLE], self.state[G_MASK] = c.addressof(self.table), TABLE_CAPACITY - 1
        self.state[G_ENCODE] = encode
        self._engine = compile_ir(handler_ir(c.addressof(self.state)))
        self.address = self._engine.get_function_address("sparsile_cuda_handler")
        self._store_entry = c.CFUNCTYPE(None, c.c_void_p, c.c_int64, c.c_int64)(
            self._engine.get_function_address("sparsile_publish"))
        self._records: list[Any] = []  # every record ever published (a native call may still read one)
        self._current: dict[int, Any] = {}  # plan id -> its published record
        self._lock = threading.Lock()

    def _slot(self, plan: int) -> int | None:
        mask = TABLE_CAPACITY - 1
        h = plan & mask
        for _ in range(TABLE_CAPACITY):
            key = self.table[2 * h]
            if key in (plan, 0):
                return h
            h = (h + 1) & mask
        return None

    def publish(self, plan: int, words: Sequence[int] | None, owner: Any = None) -> bool:
        """Make ``words`` (a record, or None: no record) the plan's record; False if the table is full.
        The record's address is stored before the key, each with one aligned 8-byte release store
        (native ``sparsile_publish``), so a handler on another core that reads the key sees the record."""
        if plan <= 0:
            return False
        with self._lock:
            h = self._slot(plan)
            if h is None:
                return False
            record = (c.c_int64 * len(words))(*words) if words is not None else None
            if record is not None:
                self._records.append((record, owner))  # owner: what the record's handles belong to
            self._current[plan] = record
            self._store_entry(c.addressof(self.table) + 16 * h, plan, c.addressof(record) if record is not None else 0)
        return True

    def record(self, plan: int) -> Any:
        """The plan's published record (a ctypes int64 array) or None."""
        return self._current.get(plan)

    def counts(self) -> dict[str, int]:
        """Native counters: fast-path calls, Python-handler calls, fast-path launch failures."""
        return {"fast": self.state[G_FAST], "slow": self.state[G_SLOWS], "launch_failures": self.state[G_FAILS]}


def launch_failed(record: Any) -> int:
    """The CUresult a fast-path launch of ``record`` failed with (0: none)."""
    return int(record[R_ERROR]) if record is not None else 0


_handler: NativeHandler | None = None
_keep: list[Any] = []  # the launch-attribute blocks the records point at
DISABLED: dict[int, str] = {}
"""Plans left on the slow path for good, with the reason (a failed fast launch, an unreplayable call)."""
_WARNED: set[str] = set()  # record-builder errors already warned about


def handler() -> NativeHandler | None:
    """The installed native handler (None before :func:`install` or when it is off)."""
    return _handler


def counts() -> dict[str, int]:
    """Native counters (zeros when the native handler is not installed)."""
    return _handler.counts() if _handler is not None else {"fast": 0, "slow": 0, "launch_failures": 0}


def install(slow: int, entry_points: tuple[int, int, int] | None = None) -> int:
    """Build the native handler around the Python handler at address ``slow`` (libcuda's launch
    and encode entry points unless given: tests pass fakes); the handler's address."""
    global _handler
    launch, launch_ex, encode = entry_points or libcuda_entry_points()
    if _handler is not None:
        _keep.append(_handler)  # a handler XLA was given must stay valid
    _handler = NativeHandler(slow, launch, launch_ex, encode)
    return _handler.address


def uninstall() -> None:
    """Forget the native handler (tests; a registered handler stays valid: its memory is kept)."""
    global _handler
    if _handler is not None:
        _keep.append(_handler)
    _handler = None


def arm(plan_id: int, plan: Any, ins: list[ffi.XlaBuffer], outs: list[ffi.XlaBuffer], ordinal: int) -> bool:
    """After the Python handler ran ``plan``: publish its record (once per plan), or leave the plan
    on the slow path for good when its fast launch failed or its call cannot be replayed natively."""
    h = _handler
    if h is None or plan_id in DISABLED:
        return False
    old = h.record(plan_id)
    if old is not None:
        error = launch_failed(old)
        if not error and old[R_ORDINAL] == ordinal:
            return True  # armed already: this slow call had a per-call reason (e.g. a misaligned buffer)
        DISABLED[plan_id] = (f"the fast-path launch failed with CUresult {error}" if error else
                             f"runs on devices {old[R_ORDINAL]} and {ordinal} (a record launches on one)")
        h.publish(plan_id, None)
        return False
    if 0 in plan.grid:  # an empty grid: the Python handler checks the buffers and launches nothing
        DISABLED[plan_id] = "the grid is empty (a 0 dimension): nothing to launch"
        return False
    try:
        words = _build_record(plan, ins, outs, ordinal)
    except Exception as exc:  # the plan keeps working on the slow path; the reason is kept for bench_jax
        words = None
        DISABLED[plan_id] = reason = f"not replayable: {type(exc).__name__}: {exc}"
        if reason not in _WARNED:  # an internal error of the record builder: make it visible, once
            _WARNED.add(reason)
            warnings.warn(f"sparsile.jax: a kernel call stays on the Python handler ({reason})",
                          RuntimeWarning, stacklevel=2)
    if words is None:
        DISABLED.setdefault(plan_id, "the launch needs host copies, stream waits or keep-alives")
        return False
    # the record keeps the launcher (and so its kernel's module) alive: the record holds its handle
    if not h.publish(plan_id, words, owner=plan.launcher(ordinal)):
        DISABLED[plan_id] = f"the native plan table is full ({TABLE_CAPACITY} plans)"
        return False
    return True


def _build_record(plan: Any, ins: list[ffi.XlaBuffer], outs: list[ffi.XlaBuffer], ordinal: int) -> list[int] | None:
    """The record of ``plan`` for these buffers, packed by the launcher itself (Launcher.snapshot)."""
    from ...backend.runtime import cudalib
    from ...backend.runtime.arrays import describe_array
    from ...backend.runtime.launch_config import normalize_grid
    from ...driver.launch import argument_of
    from .plan import DeviceView

    launcher = plan.launcher(ordinal)
    spec = launcher.spec
    snap = launcher.snapshot(plan.launch_values(spec, launcher.jax_needs_info, ins, outs, ordinal))
    if snap is None:
        return None
    params, offsets = snap
    offset_of = dict(zip((p.name for p in spec.kernel_params), offsets))
    where = {name: ((k, ins[k]) if kind == "in" else (-1 - k, outs[k])) for name, kind, k in plan.sources
             if kind != "value"}
    by_name = {p.name: p for p in spec.params}
    pointers = [(where[n][0], offset_of[n], 15 if getattr(by_name[n], "aligned16", False) else 0) for n in where
                if n in by_name and by_name[n].kind == "pointer" and n in offset_of]  # a tensor[...] A is A.tmap0
    tmaps = []
    for p in spec.params:
        if p.kind != "tensormap":
            continue
        source, buf = where[getattr(p, "source", None) or argument_of(p.name)]  # derived, or A.tmap0 of A
        info = describe_array(DeviceView(buf, ordinal), 0)
        tmaps.append(tmap_entry(source, offset_of[p.name], p.spec_for(info).driver_arguments(buf.ptr), buf.ptr))
    attrs = 0
    block = launch_attributes(launcher.cluster, launcher.pdl)
    if block is not None:
        _keep.append(block)
        attrs = c.addressof(block)
    return record_words(cudalib.handle_int(launcher.function.handle), normalize_grid(plan.grid, launcher.device),
                        launcher.block, launcher.dynamic_shared, attrs, params, offsets, pointers, tmaps,
                        ordinal)
