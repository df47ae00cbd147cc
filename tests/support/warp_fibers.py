"""Fibers for the warp simulator (tests/support/warp_sim.py): every GPU thread of a CTA runs the
JIT-compiled kernel on a stack of its own, all on the calling OS thread, switched with glibc's
``getcontext`` / ``makecontext`` / ``swapcontext``.

The host module gets the runtime of :func:`runtime_ir`: the simulator's callbacks (``tid.x``, a
shuffle, a barrier, a shared-memory access report, an fp8 ``cvt``) are defined in LLVM IR. ``tid.x``
reads the running fiber's index; every other callback stores a request (kind and three operands)
and switches back to :meth:`Fibers.resume`, which returns the request to Python; the next
``resume`` of that fiber passes the reply, which the callback returns. Python code therefore only
ever runs on the OS thread's own stack, never on a fiber's, and a thread that must wait simply is
not resumed until its barrier completes: no OS thread switches, no GIL hand-offs.

Only Linux with glibc on x86_64 or aarch64 (the hosts of NVIDIA GPUs) is supported: ``ucontext_t``
has ``uc_link`` at byte 8 and ``uc_stack`` (``ss_sp``, ``ss_flags``, ``ss_size``) at byte 16 there,
and is smaller than :data:`CONTEXT_BYTES`. Each fiber's stack has an inaccessible guard page
below it, so an overflow faults rather than corrupting a neighbour.
"""

from __future__ import annotations

import ctypes
import mmap
import platform
import sys
from typing import Any

import numpy as np

CONTEXT_BYTES = 8192  # > sizeof(ucontext_t): 968 on x86_64, 4560 on aarch64 (glibc)
STACK_BYTES = 1 << 20  # per fiber, mapped lazily; unoptimized (O0) kernels keep every value on it
_PAGE = mmap.PAGESIZE

LOG_ENTRIES = 1 << 15  # shared-memory accesses logged before the log is handed to Python
# request kinds (the first operand of a request)
DONE, SHUFFLE, BARRIER, FLUSH, CVT = range(5)
# a log entry: 8 x i64 (the access's address, bytes, kind; the thread, its barrier epoch (barrier id,
# barriers passed); then the bytes stored, zero-padded to 16)
LOG_FIELDS = ("ptr", "size", "kind", "tid", "epoch_bar", "epoch_n", "data", "data_hi")

SUPPORTED = sys.platform == "linux" and platform.machine() in ("x86_64", "aarch64") and \
    platform.libc_ver()[0] == "glibc"

_CONTEXT_FUNCTIONS = ("getcontext", "makecontext", "swapcontext")


def register_symbols() -> None:
    """Make glibc's context functions resolvable by MCJIT (it does not search the process); nothing
    where they are not :data:`SUPPORTED`."""
    import llvmlite.binding as llvm

    if not SUPPORTED:
        return
    libc = ctypes.CDLL(None)
    for name in _CONTEXT_FUNCTIONS:
        llvm.add_symbol(name, ctypes.cast(getattr(libc, name), ctypes.c_void_p).value)


def runtime_ir(kernel: str, n_params: int, declare_memcpy: bool = True) -> str:
    """The fiber runtime and the simulator's callbacks, in LLVM IR, for a module whose kernel is
    ``@kernel`` with ``n_params`` pointer parameters (passed through ``@sparsile_sim_args``);
    ``declare_memcpy`` false where the module declares ``llvm.memcpy.p0.p0.i64`` itself.

    A shared-memory access does not switch: ``@sparsile_sim_smem`` appends it to the log (see
    :data:`LOG_FIELDS`), the thread's epoch read from ``@sparsile_sim_epochs``, which the scheduler
    keeps; a full log is a :data:`FLUSH` request."""
    memcpy = "declare void @llvm.memcpy.p0.p0.i64(ptr, ptr, i64, i1)\n" if declare_memcpy else ""
    loads = "".join(f"  %a{i}p = getelementptr [{n_params} x ptr], ptr @sparsile_sim_args, i64 0, i64 {i}\n"
                    f"  %a{i} = load ptr, ptr %a{i}p\n" for i in range(n_params))
    args = ", ".join(f"ptr %a{i}" for i in range(n_params))
    return f"""
@sparsile_sim_main = global [{CONTEXT_BYTES} x i8] zeroinitializer, align 64
@sparsile_sim_contexts = global ptr null
@sparsile_sim_current = global i32 0
@sparsile_sim_reply = global i64 0
@sparsile_sim_request = global [4 x i64] zeroinitializer
@sparsile_sim_args = global [{n_params} x ptr] zeroinitializer
@sparsile_sim_log = global ptr null
@sparsile_sim_log_n = global i64 0
@sparsile_sim_epochs = global ptr null

declare i32 @getcontext(ptr)
declare void @makecontext(ptr, ptr, i32, ...)
declare i32 @swapcontext(ptr, ptr)
{memcpy}
define ptr @sparsile_sim_context(i32 %t) {{
  %base = load ptr, ptr @sparsile_sim_contexts
  %t64 = zext i32 %t to i64
  %off = mul i64 %t64, {CONTEXT_BYTES}
  %p = getelementptr i8, ptr %base, i64 %off
  ret ptr %p
}}

define i64 @sparsile_sim_yield(i64 %kind, i64 %a, i64 %b, i64 %c) {{
  store i64 %kind, ptr @sparsile_sim_request
  %pa = getelementptr [4 x i64], ptr @sparsile_sim_request, i64 0, i64 1
  store i64 %a, ptr %pa
  %pb = getelementptr [4 x i64], ptr @sparsile_sim_request, i64 0, i64 2
  store i64 %b, ptr %pb
  %pc = getelementptr [4 x i64], ptr @sparsile_sim_request, i64 0, i64 3
  store i64 %c, ptr %pc
  %t = load i32, ptr @sparsile_sim_current
  %ctx = call ptr @sparsile_sim_context(i32 %t)
  %ok = call i32 @swapcontext(ptr %ctx, ptr @sparsile_sim_main)
  %r = load i64, ptr @sparsile_sim_reply
  ret i64 %r
}}

define void @sparsile_sim_entry() {{
{loads}  call void @{kernel}({args})
  %r = call i64 @sparsile_sim_yield(i64 {DONE}, i64 0, i64 0, i64 0)
  unreachable
}}

define void @sparsile_sim_start(i32 %t, ptr %stack, i64 %size) {{
  %ctx = call ptr @sparsile_sim_context(i32 %t)
  %ok = call i32 @getcontext(ptr %ctx)
  %link = getelementptr i8, ptr %ctx, i64 8
  store ptr null, ptr %link
  %sp = getelementptr i8, ptr %ctx, i64 16
  store ptr %stack, ptr %sp
  %flags = getelementptr i8, ptr %ctx, i64 24
  store i32 0, ptr %flags
  %sz = getelementptr i8, ptr %ctx, i64 32
  store i64 %size, ptr %sz
  call void (ptr, ptr, i32, ...) @makecontext(ptr %ctx, ptr @sparsile_sim_entry, i32 0)
  ret void
}}

define void @sparsile_sim_resume(i32 %t, i64 %reply) {{
  store i32 %t, ptr @sparsile_sim_current
  store i64 %reply, ptr @sparsile_sim_reply
  %ctx = call ptr @sparsile_sim_context(i32 %t)
  %ok = call i32 @swapcontext(ptr @sparsile_sim_main, ptr %ctx)
  ret void
}}

define i32 @sparsile_sim_tid() {{
  %t = load i32, ptr @sparsile_sim_current
  ret i32 %t
}}

define i32 @sparsile_sim_shfl(i32 %mask, i32 %value, i32 %lane_mask, i32 %clamp) {{
  %v = zext i32 %value to i64
  %m = zext i32 %lane_mask to i64
  %mk = zext i32 %mask to i64
  %mk2 = shl i64 %mk, 32
  %cl = zext i32 %clamp to i64
  %mc = or i64 %mk2, %cl
  %r = call i64 @sparsile_sim_yield(i64 {SHUFFLE}, i64 %v, i64 %m, i64 %mc)
  %r32 = trunc i64 %r to i32
  ret i32 %r32
}}

define void @sparsile_sim_bar() {{
  %r = call i64 @sparsile_sim_yield(i64 {BARRIER}, i64 0, i64 -1, i64 0)
  ret void
}}

define void @sparsile_sim_bar_all(i32 %bar) {{
  %b = zext i32 %bar to i64
  %r = call i64 @sparsile_sim_yield(i64 {BARRIER}, i64 %b, i64 -1, i64 0)
  ret void
}}

define void @sparsile_sim_named_bar(i32 %bar, i32 %count) {{
  %b = zext i32 %bar to i64
  %c = zext i32 %count to i64
  %r = call i64 @sparsile_sim_yield(i64 {BARRIER}, i64 %b, i64 %c, i64 0)
  ret void
}}

define void @sparsile_sim_smem(ptr %p, i32 %size, i32 %kind) {{
entry:
  %n = load i64, ptr @sparsile_sim_log_n
  %full = icmp eq i64 %n, {LOG_ENTRIES}
  br i1 %full, label %flush, label %append
flush:
  %f = call i64 @sparsile_sim_yield(i64 {FLUSH}, i64 0, i64 0, i64 0)
  br label %append
append:
  %m = load i64, ptr @sparsile_sim_log_n
  %log = load ptr, ptr @sparsile_sim_log
  %off = mul i64 %m, 64
  %e = getelementptr i8, ptr %log, i64 %off
  %a = ptrtoint ptr %p to i64
  store i64 %a, ptr %e
  %e1 = getelementptr i8, ptr %e, i64 8
  %s = zext i32 %size to i64
  store i64 %s, ptr %e1
  %e2 = getelementptr i8, ptr %e, i64 16
  %k = zext i32 %kind to i64
  store i64 %k, ptr %e2
  %t = load i32, ptr @sparsile_sim_current
  %t64 = zext i32 %t to i64
  %e3 = getelementptr i8, ptr %e, i64 24
  store i64 %t64, ptr %e3
  %epochs = load ptr, ptr @sparsile_sim_epochs
  %toff = mul i64 %t64, 16
  %ep = getelementptr i8, ptr %epochs, i64 %toff
  %bar = load i64, ptr %ep
  %ep1 = getelementptr i8, ptr %ep, i64 8
  %passed = load i64, ptr %ep1
  %e4 = getelementptr i8, ptr %e, i64 32
  store i64 %bar, ptr %e4
  %e5 = getelementptr i8, ptr %e, i64 40
  store i64 %passed, ptr %e5
  %e6 = getelementptr i8, ptr %e, i64 48
  store i64 0, ptr %e6
  %e7 = getelementptr i8, ptr %e, i64 56
  store i64 0, ptr %e7
  call void @llvm.memcpy.p0.p0.i64(ptr %e6, ptr %p, i64 %s, i1 false)
  %m1 = add i64 %m, 1
  store i64 %m1, ptr @sparsile_sim_log_n
  ret void
}}

define i32 @sparsile_sim_cvt_e4m3(i16 %a) {{
  %x = zext i16 %a to i64
  %r = call i64 @sparsile_sim_yield(i64 {CVT}, i64 %x, i64 0, i64 0)
  %r32 = trunc i64 %r to i32
  ret i32 %r32
}}

define i32 @sparsile_sim_cvt_e5m2(i16 %a) {{
  %x = zext i16 %a to i64
  %r = call i64 @sparsile_sim_yield(i64 {CVT}, i64 %x, i64 1, i64 0)
  %r32 = trunc i64 %r to i32
  ret i32 %r32
}}
"""


class _Mapping:
    """Anonymous memory from libc's ``mmap``, unmapped on :meth:`close`."""

    def __init__(self, size: int) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.mmap.restype = ctypes.c_void_p
        self._libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                    ctypes.c_long]
        self._libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self._libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self.size = size
        # MAP_NORESERVE (0x4000 on Linux x86_64 and aarch64): the stacks are large and mostly never touched
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x4000
        addr = self._libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, flags, -1, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise MemoryError(f"mmap of {size} bytes failed (errno {ctypes.get_errno()})")
        self.addr: int = addr

    def protect_none(self, offset: int, size: int) -> None:
        if self._libc.mprotect(self.addr + offset, size, 0) != 0:  # PROT_NONE
            raise OSError(ctypes.get_errno(), "mprotect of a fiber stack's guard page failed")

    def close(self) -> None:
        if self.addr:
            self._libc.munmap(self.addr, self.size)
            self.addr = 0


class Fibers:
    """``n`` fibers running ``@sparsile_sim_entry`` of ``engine`` (a module with :func:`runtime_ir`)
    with kernel arguments ``ptrs``. Use as a context manager: the stacks are unmapped on exit, so
    no fiber may be resumed after it. ``epochs[2 * t]`` and ``epochs[2 * t + 1]`` are thread
    ``t``'s barrier epoch, which its logged accesses record."""

    def __init__(self, engine: Any, n: int, ptrs: list[int]) -> None:
        self._contexts = _Mapping(n * CONTEXT_BYTES)
        self._stacks = _Mapping(n * (STACK_BYTES + _PAGE))
        self._log = (ctypes.c_int64 * (LOG_ENTRIES * len(LOG_FIELDS)))()
        self.epochs = (ctypes.c_int64 * (2 * n))()

        def glob(name: str, ctype: Any) -> Any:
            addr = engine.get_global_value_address(name)
            assert addr, name
            return ctype.from_address(addr)

        glob("sparsile_sim_contexts", ctypes.c_void_p).value = self._contexts.addr
        glob("sparsile_sim_log", ctypes.c_void_p).value = ctypes.addressof(self._log)
        glob("sparsile_sim_epochs", ctypes.c_void_p).value = ctypes.addressof(self.epochs)
        self._log_n = glob("sparsile_sim_log_n", ctypes.c_int64)
        args = glob("sparsile_sim_args", ctypes.c_void_p * max(1, len(ptrs)))
        for i, p in enumerate(ptrs):
            args[i] = p
        self._request = glob("sparsile_sim_request", ctypes.c_int64 * 4)
        start = ctypes.CFUNCTYPE(None, ctypes.c_int32, ctypes.c_void_p, ctypes.c_int64)(
            engine.get_function_address("sparsile_sim_start"))
        self._resume = ctypes.CFUNCTYPE(None, ctypes.c_int32, ctypes.c_int64)(
            engine.get_function_address("sparsile_sim_resume"))
        for t in range(n):
            base = t * (STACK_BYTES + _PAGE)
            self._stacks.protect_none(base, _PAGE)  # the stack grows down onto its guard page
            start(t, self._stacks.addr + base + _PAGE, STACK_BYTES)

    def resume(self, t: int, reply: int) -> tuple[int, int, int, int]:
        """Run fiber ``t`` (its last request answered ``reply``) until its next request."""
        self._resume(t, reply)
        r = self._request
        return r[0], r[1], r[2], r[3]

    def take_log(self) -> np.ndarray:
        """The accesses logged since the last call, oldest first: int64, one row of
        :data:`LOG_FIELDS` each."""
        n = self._log_n.value
        self._log_n.value = 0
        return np.ctypeslib.as_array(self._log).reshape(LOG_ENTRIES, len(LOG_FIELDS))[:n].copy()

    def __enter__(self) -> Fibers:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stacks.close()
        self._contexts.close()
