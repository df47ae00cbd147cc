"""Kernel launches replayed by native code: pre-packed *records* and the LLVM IR that launches one.

A record is an int64 array: a header (``R_*`` word indices: armed, the ``CUfunction``, grid, block,
dynamic shared memory, the number of kernel parameters, the parameter bytes, pointer slots, tensor
maps, the address of a launch-attribute block, the CUresult of a failed launch, the device ordinal), then each
kernel parameter's byte offset, the pointer slots (source, byte offset, alignment mask), the tensor
-map entries (:func:`tmap_entry`) and the packed parameter bytes (:func:`record_words`). A *source*
names the buffer a slot takes per call. Everything else is fixed in the packed bytes.

:data:`LAUNCH_CORE_IR` launches a record: it copies the packed parameters onto its own stack (so
concurrent calls never share a buffer; ``cuLaunchKernel`` copies ``kernelParams`` before it
returns), writes the call's buffer addresses into the pointer slots (a set bit of a slot's mask, a
16-byte alignment the specialization assumed, or a missing buffer: not launched), re-encodes in that
stack copy (``cuTensorMapEncodeTiled``) the tensor map of every buffer not at the address the
record's map was encoded for, and calls ``cuLaunchKernel`` (``cuLaunchKernelEx`` with the launch
attributes of the record's block: :class:`AttributeBlock`, a cluster and/or programmatic dependent
launch). Two native launchers share it, text for text: the JAX CUDA handler
(integrations/jax/native_ir.py, docs/jax.md) and :class:`RecordLauncher`, which launches a record
with three addresses and a stream given by the caller (the torch launch record, docs/torch.md).
The core expects, in the function it is pasted into: ``%rec`` (the record), ``%state`` (the global
state: ``G_*`` words), ``%sg_stream`` (where the stream is stored), ``%cfg`` (64 bytes for a
``CUlaunchConfig``), ``@buffer_data(ptr %frame, i64 %src)`` (a source's address, -1: none), and
blocks ``%slow`` (not launched), ``%done`` and ``%failed`` (``%err``: the launch's CUresult).
A record whose grid has a 0 dimension goes to ``%slow``: CUDA refuses a 0 grid dimension, and the
Python launch it falls back to checks the arguments and launches nothing (records of empty grids
are not made: ``PreparedLaunch.native_record``, integrations/jax/native.py; this is the backstop).
"""

from __future__ import annotations

import ctypes as c
import functools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# the global state a native launcher reads (one int64 array): entry points, the JAX handler's
# Python fallback, plan table and mask, counters (launched, not launched, launch failures)
G_LAUNCH, G_LAUNCH_EX, G_SLOW, G_TABLE, G_MASK, G_FAST, G_SLOWS, G_FAILS, G_ENCODE = range(9)
G_WORDS = 9
TMAP_WORDS = 25
"""Words of a record's tensor-map entry: source, slot offset, data type, rank, interleave, swizzle,
L2 promotion, OOB fill, 5 dims (u64), 5 strides (u64), box (5 u32 in 3 words), element strides
(likewise), the address the pre-packed map was encoded for."""
# a record's header words; the variable part follows at R_DATA
(R_ARMED, R_FUNCTION, R_GX, R_GY, R_GZ, R_BX, R_BY, R_BZ, R_SHARED, R_NPARAMS, R_NBYTES, R_NPTR,
 R_NCHECK, R_ATTRS, R_ERROR, R_ORDINAL) = range(16)
R_DATA = 16

# the record launch, from the parameter copy to the launch's CUresult (module docstring)
LAUNCH_CORE_IR = r"""
params:
  %strm = load ptr, ptr %sg_stream
  %np_p = getelementptr i64, ptr %rec, i64 9
  %np = load i64, ptr %np_p
  %nbytes_p = getelementptr i64, ptr %rec, i64 10
  %nbytes = load i64, ptr %nbytes_p
  %nptr_p = getelementptr i64, ptr %rec, i64 11
  %nptr = load i64, ptr %nptr_p
  %nchk_p = getelementptr i64, ptr %rec, i64 12
  %nchk = load i64, ptr %nchk_p
  %ptr_base = add i64 16, %np
  %nptr3 = mul i64 %nptr, 3
  %chk_base = add i64 %ptr_base, %nptr3
  %nchk25 = mul i64 %nchk, 25
  %tpl_base = add i64 %chk_base, %nchk25
  %tpl = getelementptr i64, ptr %rec, i64 %tpl_base
  %nwords = lshr i64 %nbytes, 3
  %buf = alloca i64, i64 %nwords, align 64
  %ptrs = alloca ptr, i64 %np, align 8
  br label %copy
copy:
  %w = phi i64 [0, %params], [%w_next, %copy_body]
  %copy_more = icmp ult i64 %w, %nwords
  br i1 %copy_more, label %copy_body, label %pointers
copy_body:
  %src_w = getelementptr i64, ptr %tpl, i64 %w
  %word = load i64, ptr %src_w
  %dst_w = getelementptr i64, ptr %buf, i64 %w
  store i64 %word, ptr %dst_w
  %w_next = add i64 %w, 1
  br label %copy
pointers:
  %j = phi i64 [0, %copy], [%j_next, %ptr_body]
  %ptr_more = icmp ult i64 %j, %nptr
  br i1 %ptr_more, label %ptr_body, label %checks
ptr_body:
  %j3 = mul i64 %j, 3
  %pe = add i64 %ptr_base, %j3
  %psrc_p = getelementptr i64, ptr %rec, i64 %pe
  %psrc = load i64, ptr %psrc_p
  %poff_p = getelementptr i64, ptr %psrc_p, i64 1
  %poff = load i64, ptr %poff_p
  %pmask_p = getelementptr i64, ptr %psrc_p, i64 2
  %pmask = load i64, ptr %pmask_p
  %pdata = call ptr @buffer_data(ptr %frame, i64 %psrc)
  %pslot = getelementptr i8, ptr %buf, i64 %poff
  store ptr %pdata, ptr %pslot, align 8
  %j_next = add i64 %j, 1
  %pdata_i = ptrtoint ptr %pdata to i64
  %p_low = and i64 %pdata_i, %pmask
  %p_misaligned = icmp ne i64 %p_low, 0
  %p_missing = icmp eq i64 %pdata_i, -1
  %p_bad = or i1 %p_misaligned, %p_missing
  br i1 %p_bad, label %slow, label %pointers
checks:
  %q = phi i64 [0, %pointers], [%q_next, %chk_body], [%q_next, %encode]
  %chk_more = icmp ult i64 %q, %nchk
  br i1 %chk_more, label %chk_body, label %array
chk_body:
  %q25 = mul i64 %q, 25
  %ce = add i64 %chk_base, %q25
  %tm = getelementptr i64, ptr %rec, i64 %ce
  %csrc = load i64, ptr %tm
  %cdata = call ptr @buffer_data(ptr %frame, i64 %csrc)
  %cdata_i = ptrtoint ptr %cdata to i64
  %q_next = add i64 %q, 1
  %cached_p = getelementptr i64, ptr %tm, i64 24
  %cached = load i64, ptr %cached_p
  %same = icmp eq i64 %cdata_i, %cached
  br i1 %same, label %checks, label %reencode
reencode:
  %low = and i64 %cdata_i, 15
  %aligned = icmp eq i64 %low, 0
  br i1 %aligned, label %encode, label %slow
encode:
  %enc_p = getelementptr i64, ptr %state, i64 8
  %enc = load ptr, ptr %enc_p
  %toff_p = getelementptr i64, ptr %tm, i64 1
  %toff = load i64, ptr %toff_p
  %tslot = getelementptr i8, ptr %buf, i64 %toff
  %tdt_p = getelementptr i64, ptr %tm, i64 2
  %tdt = load i32, ptr %tdt_p
  %trank_p = getelementptr i64, ptr %tm, i64 3
  %trank = load i32, ptr %trank_p
  %til_p = getelementptr i64, ptr %tm, i64 4
  %til = load i32, ptr %til_p
  %tsw_p = getelementptr i64, ptr %tm, i64 5
  %tsw = load i32, ptr %tsw_p
  %tl2_p = getelementptr i64, ptr %tm, i64 6
  %tl2 = load i32, ptr %tl2_p
  %toob_p = getelementptr i64, ptr %tm, i64 7
  %toob = load i32, ptr %toob_p
  %tdims = getelementptr i64, ptr %tm, i64 8
  %tstrides = getelementptr i64, ptr %tm, i64 13
  %tbox = getelementptr i64, ptr %tm, i64 18
  %testr = getelementptr i64, ptr %tm, i64 21
  %enc_err = call i32 %enc(ptr %tslot, i32 %tdt, i32 %trank, ptr %cdata, ptr %tdims,
                            ptr %tstrides, ptr %tbox, ptr %testr, i32 %til, i32 %tsw, i32 %tl2, i32 %toob)
  %enc_ok = icmp eq i32 %enc_err, 0
  br i1 %enc_ok, label %checks, label %slow
array:
  %k = phi i64 [0, %checks], [%k_next, %arr_body]
  %arr_more = icmp ult i64 %k, %np
  br i1 %arr_more, label %arr_body, label %launch
arr_body:
  %ko = add i64 16, %k
  %off_p = getelementptr i64, ptr %rec, i64 %ko
  %off = load i64, ptr %off_p
  %slot = getelementptr i8, ptr %buf, i64 %off
  %arr_k = getelementptr ptr, ptr %ptrs, i64 %k
  store ptr %slot, ptr %arr_k
  %k_next = add i64 %k, 1
  br label %array
launch:
  %fn_p = getelementptr i64, ptr %rec, i64 1
  %fn = load ptr, ptr %fn_p
  %gx_p = getelementptr i64, ptr %rec, i64 2
  %gx = load i32, ptr %gx_p
  %gy_p = getelementptr i64, ptr %rec, i64 3
  %gy = load i32, ptr %gy_p
  %gz_p = getelementptr i64, ptr %rec, i64 4
  %gz = load i32, ptr %gz_p
  %gx0 = icmp eq i32 %gx, 0
  %gy0 = icmp eq i32 %gy, 0
  %gz0 = icmp eq i32 %gz, 0
  %gxy0 = or i1 %gx0, %gy0
  %grid_empty = or i1 %gxy0, %gz0
  br i1 %grid_empty, label %slow, label %grid_ok
grid_ok:
  %bx_p = getelementptr i64, ptr %rec, i64 5
  %bx = load i32, ptr %bx_p
  %by_p = getelementptr i64, ptr %rec, i64 6
  %by = load i32, ptr %by_p
  %bz_p = getelementptr i64, ptr %rec, i64 7
  %bz = load i32, ptr %bz_p
  %sh_p = getelementptr i64, ptr %rec, i64 8
  %sh = load i32, ptr %sh_p
  %at_p = getelementptr i64, ptr %rec, i64 13
  %at = load ptr, ptr %at_p
  %plain = icmp eq ptr %at, null
  br i1 %plain, label %launch_plain, label %launch_ex
launch_plain:
  %lk = load ptr, ptr %state
  %err_plain = call i32 %lk(ptr %fn, i32 %gx, i32 %gy, i32 %gz, i32 %bx, i32 %by, i32 %bz,
                             i32 %sh, ptr %strm, ptr %ptrs, ptr null)
  br label %launched
launch_ex:
  store i32 %gx, ptr %cfg
  %c1 = getelementptr i32, ptr %cfg, i64 1
  store i32 %gy, ptr %c1
  %c2 = getelementptr i32, ptr %cfg, i64 2
  store i32 %gz, ptr %c2
  %c3 = getelementptr i32, ptr %cfg, i64 3
  store i32 %bx, ptr %c3
  %c4 = getelementptr i32, ptr %cfg, i64 4
  store i32 %by, ptr %c4
  %c5 = getelementptr i32, ptr %cfg, i64 5
  store i32 %bz, ptr %c5
  %c6 = getelementptr i32, ptr %cfg, i64 6
  store i32 %sh, ptr %c6
  %cs = getelementptr i8, ptr %cfg, i64 {CFG_STREAM}
  store ptr %strm, ptr %cs
  %at_count = load i64, ptr %at
  %at_n = trunc i64 %at_count to i32
  %at_list = getelementptr i8, ptr %at, i64 {BLOCK_ATTRS}
  %ca = getelementptr i8, ptr %cfg, i64 {CFG_ATTRS}
  store ptr %at_list, ptr %ca
  %cn = getelementptr i8, ptr %cfg, i64 {CFG_NATTRS}
  store i32 %at_n, ptr %cn
  %lkx_p = getelementptr i64, ptr %state, i64 1
  %lkx = load ptr, ptr %lkx_p
  %err_ex = call i32 %lkx(ptr %cfg, ptr %fn, ptr %ptrs, ptr null)
  br label %launched
launched:
  %err = phi i32 [%err_plain, %launch_plain], [%err_ex, %launch_ex]
  %ok = icmp eq i32 %err, 0
  br i1 %ok, label %done, label %failed
""".removeprefix("\n")

RECORD_LAUNCH_IR = r"""
define internal ptr @buffer_data(ptr %frame, i64 %src) {
entry:
  %inside = icmp ult i64 %src, 3
  br i1 %inside, label %load, label %bad
load:
  %d_p = getelementptr i64, ptr %frame, i64 %src
  %d = load i64, ptr %d_p
  %null = icmp eq i64 %d, 0
  br i1 %null, label %bad, label %good
good:
  %p = inttoptr i64 %d to ptr
  ret ptr %p
bad:
  ret ptr inttoptr (i64 -1 to ptr)
}

define i32 @sparsile_record_launch(ptr %rec, i64 %a0, i64 %a1, i64 %a2, ptr %stream) {
entry:
  %cfg = alloca [8 x i64], align 8
  %frame = alloca [3 x i64], align 8
  %sg_stream = alloca ptr, align 8
  store ptr %stream, ptr %sg_stream
  store i64 %a0, ptr %frame
  %f1 = getelementptr i64, ptr %frame, i64 1
  store i64 %a1, ptr %f1
  %f2 = getelementptr i64, ptr %frame, i64 2
  store i64 %a2, ptr %f2
  %state = inttoptr i64 {STATE} to ptr
  br label %params
""" + LAUNCH_CORE_IR + r"""done:
  %fast_p = getelementptr i64, ptr %state, i64 5
  %f_old = atomicrmw add ptr %fast_p, i64 1 monotonic
  ret i32 0
failed:
  %rerr_p = getelementptr i64, ptr %rec, i64 14
  %err64 = zext i32 %err to i64
  store atomic i64 %err64, ptr %rerr_p monotonic, align 8
  %fails_p = getelementptr i64, ptr %state, i64 7
  %x_old = atomicrmw add ptr %fails_p, i64 1 monotonic
  ret i32 %err
slow:
  %slows_p = getelementptr i64, ptr %state, i64 6
  %s_old = atomicrmw add ptr %slows_p, i64 1 monotonic
  ret i32 -1
}
"""
"""``i32 sparsile_record_launch(record, address 0, address 1, address 2, stream)``: launch a record
whose sources are 0, 1, 2 (address 0: no buffer). 0: launched; -1: not launched (a misaligned or
missing buffer, a failed encode); a positive CUresult: the launch failed (also stored in the
record's ``R_ERROR`` word). ``{STATE}``: the address of the state array; ``{CFG_*}``: offsets in
``CUlaunchConfig``; ``{BLOCK_ATTRS}``: the offset of the attributes in an :class:`AttributeBlock`."""


def launch_config_constants() -> dict[str, int]:
    """The ``{CFG_*}`` placeholders of :data:`LAUNCH_CORE_IR` (byte offsets in ``CUlaunchConfig``)
    and ``{BLOCK_ATTRS}`` (the offset of the attribute array in an :class:`AttributeBlock`)."""
    from .cudalib import LaunchConfig

    assert c.sizeof(LaunchConfig) <= 64  # the core's %cfg is 8 words
    return {"CFG_STREAM": LaunchConfig.hStream.offset, "CFG_ATTRS": LaunchConfig.attrs.offset,
            "CFG_NATTRS": LaunchConfig.numAttrs.offset, "BLOCK_ATTRS": _attribute_block().attrs.offset}


def fill(text: str, values: dict[str, int]) -> str:
    """``text`` with each ``{NAME}`` placeholder of ``values`` replaced by its decimal value."""
    for key, value in values.items():
        text = text.replace("{" + key + "}", str(value))
    return text


def compile_ir(text: str) -> Any:
    """An llvmlite MCJIT engine with ``text`` (LLVM IR) compiled for the host (no C compiler);
    the engine owns the machine code: keep it alive as long as its functions may be called."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    module = llvm.parse_assembly(text)
    module.verify()
    machine = llvm.Target.from_default_triple().create_target_machine(opt=2)
    engine = llvm.create_mcjit_compiler(module, machine)
    engine.finalize_object()
    return engine


def libcuda_entry_points() -> tuple[int, int, int]:
    """The addresses of libcuda's ``cuLaunchKernel``, ``cuLaunchKernelEx``, ``cuTensorMapEncodeTiled``."""
    from .cudalib import LIBCUDA

    lib = c.CDLL(LIBCUDA)
    return tuple(c.cast(getattr(lib, name), c.c_void_p).value or 0  # type: ignore[return-value]
                 for name in ("cuLaunchKernel", "cuLaunchKernelEx", "cuTensorMapEncodeTiled"))


def tmap_entry(source: int, offset: int, arguments: dict[str, Any], address: int) -> list[int]:
    """A record's tensor-map entry from ``TensorMapSpec.driver_arguments`` (the keyword arguments of
    ``cuTensorMapEncodeTiled``) for the map encoded at ``address``: the native path re-encodes the
    map in its stack copy of the parameters when the buffer moved (backend/runtime/tensormap.py)."""
    a, rank = arguments, arguments["tensorRank"]

    def u32s(values: Sequence[int]) -> list[int]:
        raw = b"".join(int(v).to_bytes(4, "little") for v in values).ljust(24, b"\0")
        return [int.from_bytes(raw[i:i + 8], "little") for i in range(0, 24, 8)]

    def u64s(values: Sequence[int]) -> list[int]:
        return [int(v) for v in values] + [0] * (5 - len(values))

    return [source, offset, int(a["tensorDataType"]), rank, int(a["interleave"]), int(a["swizzle"]),
            int(a["l2Promotion"]), int(a["oobFill"]), *u64s(a["globalDim"]), *u64s(a["globalStrides"] or []),
            *u32s(a["boxDim"]), *u32s(a["elementStrides"]), address]


def record_words(function: int, grid: Sequence[int], block: Sequence[int], shared: int, attrs: int,
                 params: bytes, offsets: Sequence[int], pointers: Sequence[tuple[int, int, int]],
                 tmaps: Sequence[Sequence[int]], ordinal: int = 0) -> list[int]:
    """A record: ``pointers`` are (source, byte offset, alignment mask) of each pointer slot (an
    address with a bit of the mask set goes to the slow path, whose launcher reports it), ``tmaps`` entries of
    :func:`tmap_entry`; a source is ``i`` for operand i and ``-1 - j`` for result j. ``attrs``: the
    address of an ``AttributeBlock`` (:func:`launch_attributes`: then ``cuLaunchKernelEx``), or 0.
    ``ordinal``: the device the kernel is loaded on (a call XLA runs on another device goes to the slow path)."""
    padded = params + bytes(-len(params) % 8 or (8 if not params else 0))
    words = [0] * R_DATA
    words[R_ARMED], words[R_FUNCTION] = 1, function
    words[R_GX], words[R_GY], words[R_GZ] = grid
    words[R_BX], words[R_BY], words[R_BZ] = block
    words[R_SHARED], words[R_NPARAMS], words[R_NBYTES] = shared, len(offsets), len(padded)
    words[R_NPTR], words[R_NCHECK], words[R_ATTRS] = len(pointers), len(tmaps), attrs
    words[R_ORDINAL] = ordinal
    words += list(offsets)
    for triple in pointers:
        words += list(triple)
    for entry in tmaps:
        assert len(entry) == TMAP_WORDS
        words += list(entry)
    words += [int.from_bytes(padded[i:i + 8], "little") for i in range(0, len(padded), 8)]
    return [w if w < 1 << 63 else w - (1 << 64) for w in words]


_RECORD_LAUNCH = c.CFUNCTYPE(c.c_int32, c.c_void_p, c.c_uint64, c.c_uint64, c.c_uint64, c.c_void_p)


class RecordLauncher:
    """:data:`RECORD_LAUNCH_IR` compiled, with its state (libcuda's entry points unless given:
    tests pass fakes) and counters. ``launch(record address, address 0, address 1, address 2,
    stream)`` is the compiled function (ctypes, argument types set once: ints in, status out)."""

    def __init__(self, entry_points: tuple[int, int, int] | None = None):
        launch, launch_ex, encode = entry_points or libcuda_entry_points()
        self.state = (c.c_int64 * G_WORDS)()
        self.state[G_LAUNCH], self.state[G_LAUNCH_EX], self.state[G_ENCODE] = launch, launch_ex, encode
        text = fill(RECORD_LAUNCH_IR, {**launch_config_constants(), "STATE": c.addressof(self.state)})
        self._engine = compile_ir(text)
        self.launch = _RECORD_LAUNCH(self._engine.get_function_address("sparsile_record_launch"))

    @staticmethod
    def record(words: Sequence[int]) -> Any:
        """A record's words as the int64 array the native function reads (keep it alive)."""
        return (c.c_int64 * len(words))(*words)

    def counts(self) -> dict[str, int]:
        """Native counters: launched, not launched (per-call reasons), failed launches."""
        return {"launched": self.state[G_FAST], "declined": self.state[G_SLOWS],
                "launch_failures": self.state[G_FAILS]}


_shared: list[RecordLauncher] = []
_shared_lock = threading.Lock()


def shared_launcher() -> RecordLauncher:
    """The process's :class:`RecordLauncher` over libcuda's entry points, JIT-compiled on first use
    and shared by every native launch path (the torch layer's records, ``sparse_matmul``'s call
    cache). Raises where it cannot be built (no llvmlite engine, no libcuda); callers keep their
    answer."""
    with _shared_lock:
        if not _shared:
            _shared.append(RecordLauncher())
        return _shared[0]


MAX_ATTRIBUTES = 2
"""The launch attributes a record may carry: the cluster dimensions, programmatic stream serialization."""


@functools.cache
def _attribute_block() -> type[c.Structure]:
    """:class:`AttributeBlock`'s ctypes type (built on first use: it needs cuda.bindings' constants)."""
    from .cudalib import LaunchAttribute

    class AttributeBlock(c.Structure):
        """A record's launch attributes (``R_ATTRS`` holds its address): ``count``, then
        ``CUlaunchAttribute attrs[MAX_ATTRIBUTES]``; the native launch passes ``count`` and the
        address of ``attrs`` to ``cuLaunchKernelEx``."""

        _fields_ = [("count", c.c_int64), ("attrs", LaunchAttribute * MAX_ATTRIBUTES)]

    return AttributeBlock


def launch_attributes(cluster: Sequence[int], pdl: bool = False) -> Any:
    """The attribute block of a record launching with ``cluster`` and ``pdl`` (its address goes into
    the record's ``R_ATTRS``; keep it alive with the record): the cluster dimensions when the
    cluster has more than one CTA, programmatic stream serialization when ``pdl``. None when there
    is neither (a plain ``cuLaunchKernel``)."""
    from .cudalib import attribute_list

    attrs = attribute_list(cluster, pdl)
    if not attrs:
        return None
    block = _attribute_block()()
    block.count = len(attrs)
    for i, attr in enumerate(attrs):
        block.attrs[i] = attr
    return block


@dataclass(frozen=True)
class NativeRecord:
    """A prepared launch as a record (``PreparedLaunch.native_record``, driver/prepared.py): its
    ``words``; ``keep``, what the record's handles and addresses belong to (the prepared launch,
    and so its launcher and module; its launch-attribute block): keep it alive with the record;
    ``context_current(force=False)``, called before a native launch, makes the context the
    kernel is loaded in current on the calling thread (a prepared launch does the same before it
    launches); ``force``: also when the thread's cache says it is current. It returns the context
    the caller restores (``devices.leave``) once its launches are done, None when it switched none."""

    words: list[int]
    keep: tuple[Any, ...]
    context_current: Callable[..., Any]
