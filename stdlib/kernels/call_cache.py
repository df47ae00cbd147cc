"""``sparse_matmul``'s call cache: a call like an earlier one replays that call's launches instead of
planning again (docs/autotune.md, "The call cache").

Planning a ``sparse_matmul`` call (checking the operands, choosing the kernel, its tile, split-K and
the tuned table's entry, allocating C and the workspaces) cost 160-380 µs of host time per call on
the H200's host, several times the kernel at decode sizes and more than it at prefill; a replay of
one launch cost 27-50 µs there from native code (:mod:`.call_native`), 34-66 µs through its
prepared launch (benchmarks/RESULTS.md, twenty-fifth session). Everything planning decides depends
only on the call's *key*: the arguments' kinds, shapes, strides, element types, devices and 16-byte
alignment classes, the keyword options, the environment variables planning reads and the current
device. So the first call of a key runs the full path while ``driver/recording.py`` records it,
and where the record qualifies it is kept as a :class:`Replay`. A later call of the same key
allocates the same scratch (C, workspaces, zeroed counters: fresh per call, so no memory is shared
between calls, streams or CUDA graphs) and makes the same launches with its own arrays.

A record qualifies only where each array a launch reads is one of the call's own arrays (values,
metadata words, b, out), a view into one's memory (the uint32 view of int32 words, a block of
rows), the words of a ``MetadataBuffer`` (keyed by its tag, so the layers of one shape share a
record; the replay gets each buffer's words as planning does, validating a buffer it has not seen
and copying it to the device once), or scratch the planners allocated through ``empty_array`` /
``zeros_array``; and only where every launch went through ``kernel[grid]`` on the current stream.
A padded or cast copy of an operand (made outside a launch) fails that test, so such calls keep
the full path: a replay never reads a stale copy. Other arguments must be plain values (ints,
floats, strings, None, tuples of them), which the key fixes.

``SPARSILE_CALL_CACHE=0`` turns the cache off. It holds at most :data:`MAX_ENTRIES` records (the
least recently used go first), each a few launch descriptions and no arrays of its own (the words of
the MetadataBuffers it served, weakly keyed: a buffer's words go with it). A tuning table rewritten
while the process runs is read by the next planned call; records made before keep their
configuration until :func:`clear` (their results are the same).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...backend.runtime import devices
from ...backend.runtime.arrays import byte_range, describe_array
from ...backend.runtime.dtypes import DTYPES, byte_swapped
from ...driver.recording import Recording
from ..sparsity import MetadataBuffer
from .arrays import array_kind, deliver_result, empty_array, overlaps, zeros_array

ENV = "SPARSILE_CALL_CACHE"
MAX_ENTRIES = 1024
PLANNING_ENVS = ("SPARSILE_META_TMA", "SPARSILE_TUNED_TABLE", "SPARSILE_DECODE_KERNEL", "SPARSILE_DECODE_REDUCE",
                 "SPARSILE_DECODE_TABLE", "SPARSILE_LINEAR_STAGE_Y")
"""The environment variables ``sparse_matmul``'s planning reads: part of every key."""
INTERPRET = False
"""Whether interpreter calls (numpy arrays) are cached too: off, since planning checks host
metadata words' contents; the tests turn it on to exercise the cache on the CPU."""

_entries: OrderedDict[tuple[Any, ...], Any] = OrderedDict()  # least recently used first
_lock = threading.Lock()
stats = {"hits": 0, "recorded": 0, "not_cacheable": 0}
last_refusal = ""
"""Why the last call that was recorded could not be kept (tests and debugging)."""
last_prepare_error = ""
"""Why the last launch that could not be prepared for replays was not (it replays through
``kernel[grid]``; benchmarks and debugging)."""

_PLAIN = (int, float, str, bool, type(None))


def _plain(v: Any) -> bool:
    """A value the key fixes: an int, float, string, bool or None, or a tuple of them."""
    return isinstance(v, _PLAIN) or (isinstance(v, tuple) and all(isinstance(x, _PLAIN) for x in v))


def _encoded_names() -> tuple[Any, ...] | None:
    """:data:`ENV` and :data:`PLANNING_ENVS` as keys of ``os.environ``'s own mapping (bytes on
    POSIX), or None where it has none (then ``os.environ.get`` is used)."""
    data, encode = getattr(os.environ, "_data", None), getattr(os.environ, "encodekey", None)
    if not isinstance(data, dict) or encode is None:
        return None
    return tuple(encode(name) for name in (ENV, *PLANNING_ENVS))


_ENCODED = _encoded_names()


def _environment() -> tuple[Any, ...]:
    """The values of :data:`ENV` and :data:`PLANNING_ENVS` now (None where unset). Read from
    ``os.environ``'s mapping directly where it has one (``os.environ.get`` decodes each value:
    about 2 µs apiece on the H200's host), so that a change is seen on the next call."""
    data = getattr(os.environ, "_data", None) if _ENCODED is not None else None
    if data is not None:
        return tuple(data.get(k) for k in _ENCODED)
    return tuple(os.environ.get(name) for name in (ENV, *PLANNING_ENVS))


def clear() -> None:
    """Forget every record."""
    with _lock:
        _entries.clear()


_STRIDED: list[Any] = []  # torch.strided, once torch is met


def _torch_strided() -> Any:
    if not _STRIDED:
        import torch  # (the caller holds a torch tensor: imported already)

        _STRIDED.append(torch.strided)
    return _STRIDED[0]


def _array_signature(x: Any, interpret: bool) -> tuple[Any, ...] | None:
    """What planning may read of an array: kind, shape, strides, element type, device, alignment
    class; None for arrays the cache does not take (host arrays outside the interpreter)."""
    kind = array_kind(x)
    if kind == "torch" and not interpret:
        if x.layout is not _torch_strided() or x.is_neg():  # a sparse or other layout: planning says what it
            return None  # needs; a neg view (torch._neg_view): planning reads a copy with the negation applied
        return ("t", x.shape, x.stride(), x.dtype, x.get_device(), x.data_ptr() & 15)
    if kind == "cupy" and not interpret:
        return ("c", x.shape, x.strides, x.dtype, x.device.id, x.data.ptr & 15)
    if kind == "numpy" and interpret:
        # the dtype itself: its .str is "<V1" for ml_dtypes' float8_e4m3fn, float8_e4m3fnuz and int4 alike
        return ("n", x.shape, x.strides, x.dtype, x.ctypes.data & 15, x.flags.writeable)
    return None


def call_key(values: Any, meta: Any, b: Any, out: Any, interpret: bool, options: tuple[Any, ...]) -> tuple | None:
    """The key of a call (module docstring), or None where it is not cached."""
    if interpret and not INTERPRET:
        return None
    env = _environment()
    if env[0] in ("0", b"0"):  # SPARSILE_CALL_CACHE=0
        return None
    sig_v = _array_signature(values, interpret)
    sig_b = _array_signature(b, interpret)
    if sig_v is None or sig_b is None:
        return None
    if isinstance(meta, MetadataBuffer):
        data = meta.data
        sig_m: tuple[Any, ...] | None = ("buffer", meta.fmt, meta.dtype, meta.m, meta.k, tuple(data.shape),
                                         data.dtype)
    else:
        sig_m = _array_signature(meta, interpret)
    sig_o = None if out is None else _array_signature(out, interpret)
    if sig_m is None or (out is not None and sig_o is None):
        return None
    if out is not None and overlaps(out, values, b, meta.data if isinstance(meta, MetadataBuffer) else meta):
        return None  # C goes through a new array and a copy (arrays.output_array): planned every call
    # each option with its type: 2.0 and True equal (and hash as) 2, but planning refuses them for
    # split_k or num_sms where it takes 2 (a replay would run them); numpy's 2 is planned as 2
    typed = tuple((type(v), v) for v in options)
    try:
        return _Key((sig_v, sig_m, sig_b, sig_o, interpret, typed, env, devices.default_ordinal))
    except TypeError:  # an option of an unhashable type: not cached
        return None


class _Key(tuple):
    """A call's key, its hash computed once: a replay looks it up and moves it to the end of the
    least-recently-used order (tuples do not keep their hash, and this one nests a dozen parts)."""

    def __new__(cls, parts: tuple[Any, ...]) -> _Key:
        key = super().__new__(cls, parts)
        key._hash = tuple.__hash__(key)  # TypeError for an unhashable part
        return key

    def __hash__(self) -> int:
        return self._hash


@dataclass(frozen=True)
class ArrayRef:
    """Where a replayed launch takes an array: ``kind`` "input" (the call's values, meta, b, out:
    ``index`` 0-3), "scratch" (``index`` into the replay's scratch), "words" (the MetadataBuffer's
    words array); ``view`` = (element type, shape, strides and offset in elements) of a view into
    it (a reinterpretation, a block of rows), or None for the array itself."""

    kind: str
    index: int = 0
    view: tuple[Any, tuple[int, ...], tuple[int, ...], int] | None = None


def _layout(x: Any) -> tuple[int, int, tuple[int, ...], tuple[int, ...], bool] | None:
    """(address, element bytes, shape, strides in elements, contiguous) of a torch or numpy array
    (``describe_array``, the launcher's own description), or None: cupy (only the arrays
    themselves), numpy strides that are no whole number of elements."""
    kind = array_kind(x)
    if kind not in ("torch", "torch-cpu", "numpy") or (kind == "numpy" and (
            any(st % x.itemsize for st in x.strides) or byte_swapped(x.dtype))):  # (">f2": read through a copy)
        return None
    info = describe_array(x)
    if info is None or info.dtype is None:
        return None
    return info.ptr, DTYPES[info.dtype].itemsize, info.shape, info.strides, info.contiguous


def _extent(address: int, size: int, shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, int]:
    """[first byte, last byte + 1) an array with strides in elements covers (an empty one: none)."""
    return byte_range(address, shape, [st * size for st in strides], size)


def _view_in(a: Any, x: Any) -> tuple[Any, tuple[int, ...], tuple[int, ...], int] | None:
    """``a`` as a view into contiguous ``x``'s memory of the same element size: (a's element type,
    shape, strides, offset from x's start, in elements), or None where ``a`` is not one."""
    la, lx = _layout(a), _layout(x)
    if la is None or lx is None or array_kind(a) != array_kind(x) or la[1] != lx[1] or not lx[4]:
        return None
    if any(st < 0 for st in la[3]):
        return None
    lo, hi = _extent(*la[:4])
    x_lo, x_hi = _extent(*lx[:4])
    if not (x_lo <= lo and hi <= x_hi) or (lo - x_lo) % la[1] or lo == hi:
        return None
    return a.dtype, la[2], la[3], (lo - x_lo) // la[1]


def viewed(x: Any, view: tuple[Any, tuple[int, ...], tuple[int, ...], int]) -> Any:
    """The view ``view`` (:func:`_view_in`) into ``x``, a contiguous array like the recorded one."""
    dtype, shape, strides, offset = view
    v = x if x.dtype == dtype else x.view(dtype)
    if array_kind(x) in ("torch", "torch-cpu"):
        if offset == 0 and tuple(v.shape) == shape and tuple(v.stride()) == strides:
            return v
        return v.as_strided(shape, strides, v.storage_offset() + offset)
    size = v.itemsize
    return np.lib.stride_tricks.as_strided(v.reshape(-1)[offset:], shape, tuple(st * size for st in strides))


def _words_of(meta: MetadataBuffer, values: Any, interpret: bool) -> Any:
    """The array a MetadataBuffer's words are read from: its device copy, or ``data`` on the host."""
    if interpret:
        return meta.data
    from .gemm_operands import device_copies

    return device_copies.get(meta, {}).get(str(getattr(values, "device", "cupy")))


class _Refused(Exception):
    pass


@dataclass(frozen=True)
class Replay:
    """A recorded call (module docstring): its launches with array arguments as :class:`ArrayRef`, the
    scratch to allocate ((shape, element type name, zero-filled) each), the array C is delivered
    from, and whether the metadata is a MetadataBuffer (its words found once per buffer: :attr:`words`)."""

    launches: tuple[tuple[Any, tuple[Any, ...], dict[str, Any]], ...]
    scratch: tuple[tuple[tuple[int, ...], str, bool], ...]
    source: ArrayRef
    interpret: bool
    buffer: bool = False
    words: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary, compare=False)
    """Each MetadataBuffer's words as :func:`.gemm_operands.kernel_words` gave them for this key
    (validated and on the device: they depend only on the buffer and the key)."""
    native: Any = None
    """The :class:`.call_native.NativePlan` of a replay that qualifies (its launches from native
    code), else None."""

    def __call__(self, values: Any, meta: Any, b: Any, out: Any) -> Any:
        words = None
        if self.buffer:
            if not isinstance(meta, MetadataBuffer):
                return MISS
            words = self.words.get(meta)
            if words is None:
                from .gemm_operands import kernel_words

                # as planning: validated once per buffer (a diagnostic before any launch), copied
                # to the device once; the key fixes the shapes these come from
                m, k_values, k_b = int(values.shape[0]), 2 * int(values.shape[1]), int(b.shape[1])
                words = kernel_words(meta, values, meta.operand, m, k_values, k_b, self.interpret)
                self.words[meta] = words
        scratch = [(zeros_array if zero else empty_array)(b, shape, dtype, self.interpret)
                   for shape, dtype, zero in self.scratch]
        inputs = (values, meta, b, out)
        first = 0  # the first launch the prepared launches make
        if self.native is not None:  # the launches from native code (call_native.py)
            native = self.native
            c = inputs[3] if native.c_at[0] == "input" else scratch[native.c_at[1]]
            first = native.launch(values, meta if words is None else words, b, c,
                                  None if native.w_at is None else scratch[native.w_at[1]])

        def get(ref: ArrayRef) -> Any:
            a = words if ref.kind == "words" else inputs[ref.index] if ref.kind == "input" else scratch[ref.index]
            return a if ref.view is None else viewed(a, ref.view)

        for launcher, refs, kwargs in self.launches[first:]:
            if kwargs is None:  # a prepared launch taking the arrays only (:func:`_prepared`)
                launcher(*[get(r) for r in refs])
            else:
                launcher(*[get(r) if type(r) is ArrayRef else r for r in refs], **kwargs)
        return deliver_result(get(self.source), out, b)


MISS = object()
"""What :func:`replay` returns where it has no record for the call."""
FULL_PATH = object()
"""What :func:`lookup` returns for a key whose record did not qualify: plan every call, unrecorded."""


def lookup(key: tuple[Any, ...]) -> Any:
    """The :class:`Replay` of ``key``, :data:`FULL_PATH` (which becomes the most recently used: the
    call plans, no :func:`replay` follows), or None (not seen yet)."""
    entry = _entries.get(key)
    if entry is FULL_PATH:
        _used(key, entry)
    return entry


def _used(key: tuple[Any, ...], entry: Any) -> None:
    """Make ``key``'s record ``entry`` the most recently used: the last that eviction takes."""
    with _lock:
        if _entries.get(key) is entry:
            _entries.move_to_end(key)


def replay(key: tuple[Any, ...], values: Any, meta: Any, b: Any, out: Any) -> Any:
    """The result of replaying ``key``'s record with these arrays, or :data:`MISS` (no record, or
    one that did not qualify). The record becomes the most recently used."""
    entry = _entries.get(key)
    if entry is None or entry is FULL_PATH:
        return MISS
    _used(key, entry)
    result = entry(values, meta, b, out)
    if result is not MISS:
        stats["hits"] += 1
    return result


def remember(key: tuple[Any, ...], rec: Recording, values: Any, meta: Any, b: Any, out: Any, source: Any,
             interpret: bool) -> None:
    """Keep ``rec`` (the full path of a call of ``key``, C delivered from ``source``) as a
    :class:`Replay` where it qualifies (module docstring)."""
    global last_refusal
    try:
        entry: Any = _replay_of(rec, values, meta, b, out, source, interpret)
    except _Refused as e:
        stats["not_cacheable"] += 1
        last_refusal = str(e)
        entry = FULL_PATH  # the refusal depends only on the key: later calls plan without recording
    with _lock:
        _entries.pop(key, None)  # recorded again (two threads that missed it together): evicts no other
        if len(_entries) >= MAX_ENTRIES:
            _entries.popitem(last=False)
        _entries[key] = entry
    if entry is not FULL_PATH:
        stats["recorded"] += 1


def _prepared(launcher: Any, args: tuple[Any, ...], refs: tuple[Any, ...], kwargs: dict[str, Any],
              interpret: bool) -> tuple[Any, tuple[ArrayRef, ...], None] | None:
    """A GPU launch as ``kernel[grid].prepare(...)`` with only its array arguments per call (the
    others are fixed by the key), skipping ``kernel[grid]``'s per-call fingerprint of every argument;
    None where it cannot be prepared (the launch then replays through ``kernel[grid]``)."""
    from ...driver.launch import GpuLaunch

    if interpret or not isinstance(launcher, GpuLaunch) or len(args) > len(launcher.kernel.params):
        return None
    positions = [j for j, r in enumerate(refs) if type(r) is ArrayRef]
    names = tuple(launcher.kernel.params[j].name for j in positions)
    global last_prepare_error
    try:
        prepared = launcher.prepare(*args, per_call=names, **kwargs)
    except Exception as e:  # a launch prepare() does not take: kernel[grid] replays it
        last_prepare_error = f"{launcher.kernel.name}: {type(e).__name__}: {e}"[:300]
        return None
    return prepared, tuple(refs[j] for j in positions), None


def _replay_of(rec: Recording, values: Any, meta: Any, b: Any, out: Any, source: Any, interpret: bool) -> Replay:
    if rec.unreplayable:
        raise _Refused(rec.unreplayable)
    if not rec.launches:
        raise _Refused("nothing was launched")
    if source is None:
        raise _Refused("the call is not kept (an empty K, a Blackwell plan)")
    buffer = meta if isinstance(meta, MetadataBuffer) else None
    inputs = (values, None if buffer is not None else meta, b, out)
    words = _words_of(buffer, values, interpret) if buffer is not None else None
    scratch_ids: dict[int, int] = {}
    scratch: list[tuple[tuple[int, ...], str, bool]] = []

    def scratch_index(x: Any) -> int:
        if id(x) not in scratch_ids:
            scratch_ids[id(x)] = len(scratch)
            scratch.append((tuple(int(d) for d in x.shape), str(x.dtype).removeprefix("torch."), rec.scratch[id(x)][1]))
        return scratch_ids[id(x)]

    def ref_of(a: Any) -> ArrayRef:
        for i, x in enumerate(inputs):
            if x is not None and a is x:
                return ArrayRef("input", i)
        if id(a) in rec.scratch and rec.scratch[id(a)][0] is a:
            return ArrayRef("scratch", scratch_index(a))
        if words is not None and a is words:
            return ArrayRef("words")
        for i, x in enumerate(inputs):  # a view into an argument: a reinterpretation, a block of rows
            view = None if x is None else _view_in(a, x)
            if view is not None:
                return ArrayRef("input", i, view)
        view = None if words is None else _view_in(a, words)
        if view is not None:
            return ArrayRef("words", 0, view)
        for x, _ in rec.scratch.values():
            view = _view_in(a, x)
            if view is not None:
                return ArrayRef("scratch", scratch_index(x), view)
        raise _Refused(f"a launch reads an array of shape {tuple(a.shape)} that is no argument, view or scratch "
                       "(a padded or cast copy)")

    def arg_of(a: Any) -> Any:
        if array_kind(a) in ("torch", "torch-cpu", "cupy", "numpy"):
            return ref_of(a)
        if _plain(a):
            return a
        raise _Refused(f"a launch takes a {type(a).__name__} argument")

    launches, all_refs = [], []
    for launcher, args, kwargs in rec.launches:
        refs = tuple(arg_of(a) for a in args)
        all_refs.append(refs)
        for name, v in kwargs.items():
            if not _plain(v):
                raise _Refused(f"a launch takes keyword {name} of type {type(v).__name__}")
        launches.append(_prepared(launcher, args, refs, kwargs, interpret) or (launcher, refs, dict(kwargs)))
    source_ref = ref_of(source)
    native = None
    if not interpret:
        from .call_native import native_plan

        native = native_plan(rec.launches, tuple(all_refs), scratch, source_ref,
                             (values, meta if buffer is None else words, b, out))
    return Replay(tuple(launches), tuple(scratch), source_ref, interpret, buffer is not None, native=native)
