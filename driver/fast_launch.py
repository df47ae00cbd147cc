"""The common path of ``kernel[grid](*args)``: a launch whose arguments are of kinds seen before.

A full call binds the arguments to the parameters, specializes them (element types, ranks,
16-byte alignment, 16-divisibility of integers, constexpr values), looks up the launcher and maps
the bound arguments onto the launcher's parameters. All of that depends only on the arguments'
*fingerprints* (``frontend.sema.specialize.fingerprint``: an array's type, dtype, rank and alignment;
an integer's sign, bit length and divisibility, only its divisibility when the parameter is
annotated with an integer type, whose range the launcher checks; a constexpr's type and value), the number of
positional arguments, the keyword names, the device and the kernel's options. The device is the one
the arrays live on (driver/array_devices.py): on a host of several GPUs the key also holds the
device of the first array on a GPU (a CUDA tensor's ``get_device()``, another array's
``array_device``: a non-torch array with ``data_ptr`` among them; a DeviceBuffer's fingerprint holds
its own), on a host of one GPU the key is computed as before, with the current device only. A call whose other
arrays are on another GPU fails the launcher's device check and takes the full path, which refuses
it (SP0707, naming both devices). So after one full
call, :func:`remember` files a :class:`FastEntry` under that key; later calls with the same key
build the launcher's argument list with one ``itemgetter`` and launch. The launcher still checks
every argument (device, dtype, contiguity, ranges) exactly as before. When the first call's
arrays were all device arrays, the entry holds a :class:`~.prepared.PreparedLaunch` of the call,
which packs later arguments straight into its own parameter buffer (a host array met later, e.g. a
CPU tensor where a CUDA one was, falls back to the launcher, which copies it).

Calls with a run-time argument given by keyword, an argument without a cheap fingerprint (a
``MetadataBuffer``, unusual objects), host arrays read through TMA, or torch tensors none of which
is on a GPU (a CPU tensor's fingerprint is a CUDA tensor's, and an entry fixes whether calls launch on
torch's current stream) take the full path.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from ..backend.runtime.arguments import MISSING, is_torch_type
from ..backend.runtime.launch_config import normalize_grid
from ..frontend.diagnostics import LaunchError
from ..frontend.ir import types as T
from ..frontend.sema.captures import EMPTY, CaptureSet
from ..frontend.sema.specialize import fingerprint, grid_lookup_error
from ..frontend.sema.values import is_constant_binding
from .array_devices import array_device, several_gpus
from .grid import grid_meta
from .prepared import PREPARED_HOST, PreparedLaunch, torch_current_stream

MAX_ENTRIES = 256
"""Fast entries kept per kernel (one per argument fingerprint; cleared when full)."""


class FastLaunches:
    """The fast entries of one kernel, valid while its options and its parameters are unchanged
    (a ``@jit`` kernel's annotations may read Python globals: when one changes, the parameters are
    evaluated anew, and which are constexprs or integers, what the fingerprints go by, may differ)."""

    def __init__(self, kernel: Any):
        self.options = dict(kernel.options)
        self.params = kernel.params
        self.entries: dict[tuple[Any, ...], FastEntry] = {}
        self.flags = tuple(p.annotation is T.CONSTEXPR for p in kernel.params)
        self.tensor_types: set[type] = set()
        self.ints = tuple(isinstance(p.annotation, T.ScalarType) and p.annotation.is_int for p in kernel.params)
        self.constexpr = {p.name: p.annotation is T.CONSTEXPR for p in kernel.params}
        from ..backend import runtime
        from ..backend.runtime import devices

        self._devices = devices
        self._buffer_type = runtime.DeviceBuffer
        if several_gpus():  # (on a host of one GPU every CUDA array is on the current device)
            self.key = self._key_with_device  # type: ignore[method-assign]

    def valid_for(self, kernel: Any) -> bool:
        """Whether these entries were made for ``kernel``'s current options and parameters."""
        return self.options == kernel.options and self.params is kernel.params

    def key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
        """The fingerprint of a call, or None when some argument has none."""
        prints: list[Any] = [self._devices.default_ordinal, len(args)]
        tensors, buffer_type = self.tensor_types, self._buffer_type
        for value, constexpr, annotated_int in zip(args, self.flags, self.ints):
            cls = type(value)
            if cls in tensors and not constexpr:  # fingerprint of a torch tensor, inlined
                prints.append((cls, value.dtype, value.ndim, value.data_ptr() % 16 == 0))
                continue
            if annotated_int and cls is int:  # its range is the launcher's check: only 16-divisibility
                prints.append(value % 16 == 0)
                continue
            if constexpr and cls is int:  # fingerprint's (int, value) of an int constexpr, inlined
                prints.append((int, value))
                continue
            if cls is buffer_type and not constexpr:  # _buffer_fingerprint, inlined
                prints.append((cls, value.dtype, value.ndim, value.ptr % 16 == 0, value.device))
                continue
            fp = fingerprint(value, constexpr)
            if fp is None:
                fp = _buffer_fingerprint(value)
                if fp is None:
                    return None
            elif is_torch_type(cls):
                tensors.add(cls)
            prints.append(fp)
        for name, value in kwargs.items():  # options (num_warps=...) count as constexprs
            constexpr = self.constexpr.get(name, True)
            if constexpr and type(value) is int:  # fingerprint's (int, value) of an int constexpr, inlined
                prints.append((name, (int, value)))
                continue
            fp = fingerprint(value, constexpr)
            if fp is None:
                return None
            prints.append((name, fp))
        return tuple(prints)

    def _key_with_device(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
        """:meth:`key` on a host of several GPUs: with the device of the first run-time argument
        on a GPU, the device the launch runs on (driver/array_devices.py): a CUDA tensor's
        ``get_device()``, another array's :func:`~.array_devices.array_device` (a non-torch array
        with ``data_ptr``: its fingerprint holds no device)."""
        key = FastLaunches.key(self, args, kwargs)
        if key is None:
            return None
        tensors = self.tensor_types
        for value, constexpr in zip(args, self.flags):
            if constexpr:
                continue
            if type(value) in tensors:
                device = value.get_device()
                if device >= 0:
                    return (*key, device)
                continue
            device = array_device(value)
            if device is not None:
                return (*key, device)
        return key


def _buffer_fingerprint(value: Any) -> Any:
    """A DeviceBuffer's fingerprint (it has no ``data_ptr``), its device included."""
    if type(value).__name__ == "DeviceBuffer" and hasattr(value, "ptr"):
        return (type(value), value.dtype, value.ndim, value.ptr % 16 == 0, value.device)
    return None


class FastEntry:
    """What a call with a known fingerprint needs: a prepared launch (when the arguments were
    device arrays: it packs them straight into its own parameter buffer), else the launcher with
    where each of its arguments comes from in ``args + pad``; the constexpr values (for a callable
    grid) and whether the stream defaults to torch's current one.

    ``meta``: what a grid function is given besides this call's positional arguments (``names``:
    the kernel's parameters, in order): the constexpr values and the run-time arguments left at
    their defaults, never the arguments of the call that filed the entry (the entry would keep
    its arrays alive for as long as the kernel)."""

    __slots__ = ("captures", "getter", "launcher", "meta", "names", "pad", "prepared", "single", "torch_stream")

    def __init__(self, launcher: Any, getter: Callable[[tuple[Any, ...]], Any], single: bool, pad: tuple[Any, ...],
                 meta: dict[str, Any], torch_stream: bool, prepared: Any = None, names: tuple[str, ...] = (),
                 captures: CaptureSet | None = None):
        self.launcher, self.getter, self.single, self.pad = launcher, getter, single, pad
        self.meta, self.torch_stream, self.prepared, self.names = meta, torch_stream, prepared, names
        self.captures = captures
        """What the kernel's parameters and the launcher's IR read from Python (:func:`entry_captures`),
        checked before each launch; None when nothing was read (a ``.spk`` kernel)."""

    def launch(self, grid: Any, args: tuple[Any, ...], stream: Any) -> None:
        if callable(grid):  # the call's arguments (its positional ones: the others are in meta), constexpr values
            call_meta = dict(zip(self.names, args))
            call_meta.update(self.meta)
            try:
                grid = grid(call_meta)
            except KeyError as exc:  # (a name the call lacks: SP0710; the user's own error else)
                error = grid_lookup_error(exc, call_meta, self.launcher.spec.kernel_name)
                if error is None:
                    raise
                raise error from exc
        if grid is None:  # (the prepared launch's None is its own grid, the first call's): SP0710
            normalize_grid(grid, self.launcher.device)
        if self.prepared is not None:
            try:
                self.prepared.run(args, stream, grid)  # count and captures: checked by the caller
                return
            except LaunchError as exc:  # a host array this time: the launcher copies it
                if exc.code != PREPARED_HOST:
                    raise
        values = self.getter(args + self.pad if self.pad else args)
        if self.single:
            values = (values,)
        if stream is None and self.torch_stream:
            stream = torch_current_stream(self.launcher.device.ordinal)
        self.launcher(grid, values, stream=stream)


def entry_captures(kernel: Any, launcher: Any) -> CaptureSet | None:
    """The Python values a fast entry's launches depend on, as one set checked once per launch: the
    launcher's captures (its IR's, which hold the reads of the parameters' annotations and defaults
    it was specialized with: ``Kernel.ir_entry``) joined with the kernel's parameter captures of now
    (the same places: a place read by both is kept once), or None when there are none. The entry
    lives in the :class:`FastLaunches` of the kernel's current parameters (``valid_for``), so these
    parameter captures are the kernel's for as long as the entry is used."""
    captures = (getattr(launcher, "captures", None) or EMPTY) + kernel._param_captures
    return captures if captures else None


def remember(kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any], launcher: Any, bound: dict[str, Any],
             bindings: dict[str, Any], grid: Any) -> None:
    """File the fast entry of a call that took the full path (when it can have one); ``grid``: the
    call's grid, resolved."""
    fast = kernel.__dict__.get("_fast_launches")
    if fast is None or not fast.valid_for(kernel):
        fast = kernel.__dict__["_fast_launches"] = FastLaunches(kernel)
    names = [p.name for p in kernel.params]
    if any(name in kwargs and not is_constant_binding(bindings.get(name)) for name in names):
        return  # a run-time argument by keyword: the full path
    torch_stream = any(is_torch_type(type(v)) and v.is_cuda for v in bound.values())
    if not torch_stream and any(is_torch_type(type(v)) for v in bound.values()):
        # torch tensors, none on a GPU: the stream would be fixed at the legacy default one for every
        # later call of this fingerprint, which a CUDA tensor shares with a CPU one on a host of one GPU
        # (its launch belongs on torch's current stream); the launcher copies these anyway: the full path
        return
    key = fast.key(args, kwargs)
    if key is None:
        return
    pad: list[Any] = [MISSING]  # constexprs: in the key already, so the launcher need not check them
    index: dict[str, int] = {}
    for j, name in enumerate(names):
        if is_constant_binding(bindings.get(name)):
            index[name] = len(args)
        elif j < len(args):
            index[name] = j
        else:  # a run-time parameter left at its default
            index[name] = len(args) + len(pad)
            pad.append(bound[name])
    sources = [index[p.name.split(".tmap")[0] if p.kind == "tensormap" else p.name] for p in launcher.spec.user_params]
    if not sources:
        return
    positional = set(names[:len(args)])  # (a later call's own: FastEntry.launch; constexprs: their values)
    meta = {k: v for k, v in grid_meta(bound, bindings).items()
            if k not in positional or is_constant_binding(bindings.get(k))}
    try:  # device arrays only (host arrays raise SP0733): the prepared launch's faster packing
        prepared = PreparedLaunch(kernel, launcher, bound, bindings, list(range(len(args))), grid)
    except LaunchError:
        prepared = None
    if len(fast.entries) >= MAX_ENTRIES:
        fast.entries.clear()
    fast.entries[key] = FastEntry(launcher, operator.itemgetter(*sources), len(sources) == 1,
                                  tuple(pad) if max(sources) >= len(args) else (), meta, torch_stream, prepared,
                                  tuple(names), entry_captures(kernel, launcher))
