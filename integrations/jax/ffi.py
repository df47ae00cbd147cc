"""XLA's typed FFI from pure Python: the ``sparsile_call`` custom-call target.

XLA calls a typed-FFI handler with one ``XLA_FFI_CallFrame*`` (the stable C API of
``xla/ffi/api/c_api.h``, shipped inside jaxlib under ``jax.ffi.include_dir()``). The handler here is a
:class:`ctypes.CFUNCTYPE` callback wrapped in a PyCapsule: XLA calls it like a C function, ctypes
takes the GIL and runs :func:`_handle`, which

* answers the *metadata* query (a call frame whose extension chain starts with
  ``XLA_FFI_Extension_Metadata``; XLA sends it once, at registration, with no API pointer) with the
  FFI API version of the running jaxlib, read from its own ``c_api.h`` (XLA refuses a handler
  whose version differs);
* at the *execute* stage decodes the argument and result buffers (element type, device address,
  dimensions) and the one attribute, ``sparsile_plan`` (an int64 naming a :class:`CallPlan` built at
  trace time), asks XLA for the device ordinal (``XLA_FFI_DeviceOrdinal_Get``) and, on CUDA, for the
  stream (``XLA_FFI_Stream_Get``), and hands the buffers to the plan: on CUDA it launches the
  compiled kernel on XLA's stream with XLA's own device pointers (no copy); on the CPU it runs the
  numpy interpreter on views of XLA's host buffers (no copy either);
* turns any Python exception into an ``XLA_FFI_Error`` (``XLA_FFI_Error_Create``), which jax raises
  as an ``XlaRuntimeError`` carrying the sparsile diagnostic text.

No C compiler is involved: docs/jax.md explains the choice. On CUDA the handler XLA calls is
native code (:mod:`.native`, JIT-compiled by llvmlite) that launches armed plans without the GIL and
calls the Python handler here for everything else (the *slow path*), which then arms the plan.
"""

from __future__ import annotations

import ctypes as c
import functools
import hashlib
import os
import re
import threading
import time
import traceback
from typing import Any

import numpy as np

TARGET = "sparsile_call"
"""The custom-call target name, registered for the CPU and (when jaxlib has it) CUDA platforms."""
PLAN_ATTRIBUTE = "sparsile_plan"

_EXTENSION_METADATA = 1
_STAGE_EXECUTE = 3
_ERROR_INTERNAL = 13


class _ExtensionBase(c.Structure):
    pass


_ExtensionBase._fields_ = [("struct_size", c.c_size_t), ("type", c.c_int), ("next", c.POINTER(_ExtensionBase))]


class _ApiVersion(c.Structure):
    _fields_ = [("struct_size", c.c_size_t), ("extension_start", c.c_void_p), ("major_version", c.c_int),
                ("minor_version", c.c_int)]


class _Metadata(c.Structure):
    _fields_ = [("struct_size", c.c_size_t), ("api_version", _ApiVersion), ("traits", c.c_uint32),
                ("state_type_id", c.c_int64)]


class _MetadataExtension(c.Structure):
    _fields_ = [("extension_base", _ExtensionBase), ("metadata", c.POINTER(_Metadata))]


class _Buffer(c.Structure):
    _fields_ = [("struct_size", c.c_size_t), ("extension_start", c.c_void_p), ("dtype", c.c_int),
                ("data", c.c_void_p), ("rank", c.c_int64), ("dims", c.c_void_p)]


class _List(c.Structure):  # XLA_FFI_Args and XLA_FFI_Rets have the same layout
    _fields_ = [("struct_size", c.c_size_t), ("extension_start", c.c_void_p), ("size", c.c_int64),
                ("types", c.c_void_p), ("items", c.c_void_p)]


class _Attrs(c.Structure):
    _fields_ = [("struct_size", c.c_size_t), ("extension_start", c.c_void_p), ("size", c.c_int64),
                ("types", c.c_void_p), ("names", c.c_void_p), ("attrs", c.c_void_p)]


class _Scalar(c.Structure):
    _fields_ = [("dtype", c.c_int), ("value", c.c_void_p)]  # value: a pointer to the scalar


class _CallFrame(c.Structure):
    _fields_ = [("struct_size", c.c_size_t), ("extension_start", c.c_void_p), ("api", c.c_void_p),
                ("ctx", c.c_void_p), ("stage", c.c_int), ("args", _List), ("rets", _List), ("attrs", _Attrs),
                ("future", c.c_void_p)]


class _ErrorCreateArgs(c.Structure):
    _fields_ = [("struct_size", c.c_size_t), ("extension_start", c.c_void_p), ("message", c.c_char_p),
                ("errc", c.c_int)]


class _StreamGetArgs(c.Structure):
    _fields_ = [("struct_size", c.c_size_t), ("extension_start", c.c_void_p), ("ctx", c.c_void_p),
                ("stream", c.c_void_p)]


class _OrdinalGetArgs(c.Structure):
    _fields_ = [("struct_size", c.c_size_t), ("extension_start", c.c_void_p), ("ctx", c.c_void_p),
                ("device_ordinal", c.c_int32)]


_API_FUNCTIONS = ("Error_Create", "Error_GetMessage", "Error_Destroy", "Handler_Register", "Stream_Get",
                  "Type_Register", "ExecutionContext_Get", "State_Set", "State_Get", "DeviceMemory_Allocate",
                  "DeviceMemory_Free", "ThreadPool_Schedule", "ThreadPool_NumThreads", "Future_Create",
                  "Future_SetAvailable", "Future_SetError", "RunId_Get", "DeviceOrdinal_Get")


class _Api(c.Structure):
    _fields_ = [("struct_size", c.c_size_t), ("extension_start", c.c_void_p), ("api_version", _ApiVersion),
                ("internal_api", c.c_void_p), *((name, c.c_void_p) for name in _API_FUNCTIONS)]


_ERROR_CREATE = c.CFUNCTYPE(c.c_void_p, c.POINTER(_ErrorCreateArgs))
_STREAM_GET = c.CFUNCTYPE(c.c_void_p, c.POINTER(_StreamGetArgs))
_ORDINAL_GET = c.CFUNCTYPE(c.c_void_p, c.POINTER(_OrdinalGetArgs))
_HANDLER = c.CFUNCTYPE(c.c_void_p, c.c_void_p)  # XLA_FFI_Error* handler(XLA_FFI_CallFrame*)

# XLA_FFI_DataType codes (c_api.h) -> numpy dtype names
XLA_DTYPES: dict[int, str] = {1: "bool", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "uint8", 7: "uint16",
                              8: "uint32", 9: "uint64", 10: "float16", 11: "float32", 12: "float64", 16: "bfloat16",
                              19: "float8_e5m2", 20: "float8_e4m3fn"}


def jax_ffi() -> Any:
    """``jax.ffi`` (``jax.extend.ffi`` before it moved there)."""
    import jax

    found = getattr(jax, "ffi", None)
    if found is None:
        import jax.extend.ffi as found
    return found


@functools.cache
def api_version() -> tuple[int, int]:
    """(major, minor) FFI API version of the installed jaxlib, from the ``c_api.h`` it ships."""
    path = os.path.join(jax_ffi().include_dir(), "xla", "ffi", "api", "c_api.h")
    with open(path) as f:
        text = f.read()
    major = re.search(r"#define XLA_FFI_API_MAJOR (\d+)", text)
    minor = re.search(r"#define XLA_FFI_API_MINOR (\d+)", text)
    if major is None or minor is None:
        raise RuntimeError(f"no XLA_FFI_API_MAJOR / XLA_FFI_API_MINOR in {path}")
    return int(major.group(1)), int(minor.group(1))


class XlaBuffer:
    """One buffer of the call frame: XLA's address, element type and dimensions (row-major)."""

    __slots__ = ("dtype", "ptr", "shape")

    def __init__(self, ptr: int, dtype: str, shape: tuple[int, ...]):
        self.ptr, self.dtype, self.shape = ptr, dtype, shape

    def host_view(self, writable: bool) -> np.ndarray:
        """A numpy array over the buffer itself (CPU platform only: host memory)."""
        dt = numpy_dtype(self.dtype)
        count = int(np.prod(self.shape, dtype=np.int64))
        if count == 0 or not self.ptr:
            view = np.empty(self.shape, dt)
        else:
            raw = (c.c_ubyte * (count * dt.itemsize)).from_address(self.ptr)
            view = np.frombuffer(raw, dtype=dt).reshape(self.shape)
        view.flags.writeable = writable
        return view


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype called ``name`` (bfloat16 and the float8 types from ml_dtypes)."""
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))


# Decoding maps the frame's structs in place with ``from_address`` (no copy, and unlike ``cast``
# or ``string_at`` no foreign-function call per field: those cost microseconds each).
_U64 = c.c_uint64


def _words(address: int, count: int) -> list[int]:
    return (_U64 * count).from_address(address)[:] if count else []


def _buffers(items: _List) -> list[XlaBuffer]:
    """The buffers of an XLA_FFI_Args / XLA_FFI_Rets."""
    out = []
    for address in _words(items.items, items.size):
        b = _Buffer.from_address(address)
        dims = tuple((c.c_int64 * b.rank).from_address(b.dims)[:]) if b.rank else ()
        out.append(XlaBuffer(b.data or 0, XLA_DTYPES.get(b.dtype, f"xla-dtype-{b.dtype}"), dims))
    return out


def _plan_id(attrs: _Attrs) -> int:
    for name, attr in zip(_words(attrs.names, attrs.size), _words(attrs.attrs, attrs.size)):
        ptr, length = _words(name, 2)  # XLA_FFI_ByteSpan: (const char* ptr, size_t len)
        if length == len(_PLAN_NAME) and (c.c_char * length).from_address(ptr).raw == _PLAN_NAME:
            return c.c_int64.from_address(_Scalar.from_address(attr).value).value
    raise RuntimeError(f"the custom call has no `{PLAN_ATTRIBUTE}` attribute")


_PLAN_NAME = PLAN_ATTRIBUTE.encode()


_plans: dict[int, Any] = {}
_plans_lock = threading.Lock()


def add_plan(plan: Any, description: str | None = None) -> int:
    """Keep ``plan`` for the process (compiled executables refer to it by number); its number.

    With a ``description`` (the plan's content: kernel source, specialization, grid, arguments) the
    number is a 63-bit hash of it, the same in every process: an executable that JAX's persistent
    compilation cache hands to another process then names the plan that process traced for the
    same program, never another plan that happens to have the same position in the registry."""
    with _plans_lock:
        if description is None:
            number = len(_plans) + 1
            while number in _plans:
                number += 1
        else:
            digest = hashlib.blake2b(description.encode(), digest_size=8).digest()
            number = int.from_bytes(digest, "little") & (2**63 - 1)
        # the same content traced again keeps the first plan: its launcher and module stay the ones
        # a native record armed from it launches (integrations/jax/native.py), and nothing reloads
        _plans.setdefault(number, plan)
    return number


class _ApiCalls:
    """The FFI API functions the handler calls, as ctypes callables (built once per API table)."""

    def __init__(self, address: int):
        api = _Api.from_address(address)
        self.error_create = _ERROR_CREATE(api.Error_Create)
        self.stream_get = _STREAM_GET(api.Stream_Get)
        has_ordinal = api.struct_size >= _Api.DeviceOrdinal_Get.offset + c.sizeof(c.c_void_p)
        self.ordinal_get = _ORDINAL_GET(api.DeviceOrdinal_Get) if has_ordinal and api.DeviceOrdinal_Get else None

    def stream(self, ctx: int) -> int:
        args = _StreamGetArgs(c.sizeof(_StreamGetArgs), None, ctx, None)
        if self.stream_get(c.byref(args)):
            raise RuntimeError("XLA_FFI_Stream_Get failed: XLA gave no CUDA stream for this call")
        return int(args.stream or 0)

    def ordinal(self, ctx: int) -> int:
        if self.ordinal_get is None:
            return 0  # an older XLA without the call: device 0
        args = _OrdinalGetArgs(c.sizeof(_OrdinalGetArgs), None, ctx, 0)
        return 0 if self.ordinal_get(c.byref(args)) else int(args.device_ordinal)

    def error(self, message: str) -> int:
        args = _ErrorCreateArgs(c.sizeof(_ErrorCreateArgs), None, message.encode("utf-8", "replace"), _ERROR_INTERNAL)
        return int(self.error_create(c.byref(args)) or 0)


_apis: dict[int, _ApiCalls] = {}


def _api(address: int) -> _ApiCalls:
    found = _apis.get(address)
    if found is None:
        found = _apis[address] = _ApiCalls(address)
    return found


def _answer_metadata(extension: int) -> None:
    """Fill XLA_FFI_Metadata: this jaxlib's API version, no traits (not command-buffer compatible:
    XLA calls the handler on every execution)."""
    ext = _MetadataExtension.from_address(extension)
    metadata = ext.metadata.contents
    major, minor = api_version()
    metadata.api_version.struct_size = c.sizeof(_ApiVersion)
    metadata.api_version.major_version = major
    metadata.api_version.minor_version = minor
    metadata.traits = 0


STATS = {"calls": 0, "seconds": 0.0}
"""Executions of the Python handler and the time spent in them (GIL held), for benchmarks/bench_jax.py.
Calls the native fast path serves (integrations/jax/native.py) are not counted or timed here: they
are counted natively (``native.counts()``)."""


def _make_handler(platform: str) -> Any:
    def handle(address: int) -> int | None:
        start = time.perf_counter()
        try:
            return _handle(address, platform)
        finally:
            STATS["calls"] += 1
            STATS["seconds"] += time.perf_counter() - start

    return _HANDLER(handle)


def _handle(address: int, platform: str) -> int | None:
    """One call of the handler: the metadata query, or an execution (errors become XLA errors)."""
    frame = _CallFrame.from_address(address)
    extension = frame.extension_start
    if extension and _ExtensionBase.from_address(extension).type == _EXTENSION_METADATA:
        return _answer_metadata(extension)
    api = _api(frame.api)
    try:
        if frame.stage != _STAGE_EXECUTE:
            return None
        plan_id = _plan_id(frame.attrs)
        plan = _plans.get(plan_id)
        if plan is None:
            raise _untraced(plan_id)
        ins, outs = _buffers(frame.args), _buffers(frame.rets)
        if platform == "cuda":
            ordinal = api.ordinal(frame.ctx)
            plan.run_cuda(ins, outs, api.stream(frame.ctx), ordinal)
            if _native_on:
                from . import native

                native.arm(plan_id, plan, ins, outs, ordinal)
        else:
            plan.run_host(ins, outs)
        return None
    except BaseException as exc:  # nothing may unwind through XLA's C frames
        text = str(exc) if getattr(exc, "code", None) else "".join(traceback.format_exception(exc))
        return api.error(f"error[SP0936]: a sparsile kernel call failed while XLA ran it\n{text}")


def _untraced(plan_id: int) -> Exception:
    """SP0936 for an executable naming a plan this process has not traced: one compiled elsewhere
    (``jax.export``, a serialized executable) runs only after its program is traced here, which
    registers its plans under the same numbers (the numbers hash the plans' content)."""
    from .errors import SP_JAX_RUNTIME, JaxCallError

    return JaxCallError(SP_JAX_RUNTIME, f"the program names sparsile plan {plan_id}, which this process has not "
                        "traced (an executable compiled in another process: jax.export, a serialized executable)",
                        help="trace the same program in this process first (call the jitted function once, or "
                             "jax.jit(f).lower(*args)): its sparsile calls get the same plan numbers",
                        located=False)


_registered: dict[str, Any] = {}
_native_on = False  # the CUDA handler registered is the native one (integrations/jax/native.py)


def register(platform: str) -> None:
    """Register the ``sparsile_call`` handler for ``platform`` ("cpu" or "cuda"), once. On CUDA the
    handler is the native fast path wrapped around the Python one (:mod:`.native`) unless
    ``SPARSILE_JAX_NATIVE=0`` or it cannot be built (no libcuda): then the Python handler itself."""
    global _native_on
    if platform in _registered:
        return
    callback = _make_handler(platform)
    _registered[platform] = callback  # the callback must outlive every executable using it
    address = c.cast(callback, c.c_void_p).value
    if platform == "cuda":
        from . import native

        if native.enabled():
            try:
                address = native.install(address)
                _native_on = True
            except (OSError, RuntimeError) as exc:  # no libcuda / llvmlite cannot JIT here
                import warnings

                warnings.warn(f"sparsile.jax: no native fast path ({exc}); every call runs the Python "
                              f"handler (set {native.ENV}=0 to silence this)", RuntimeWarning, stacklevel=2)
    capsule = jax_ffi().pycapsule(address)
    jax_ffi().register_ffi_target(TARGET, capsule, platform="CUDA" if platform == "cuda" else "cpu")
