"""Run a kernel's LLVM IR on the host CPU, one CTA, every thread at once: a model of the GPU for
kernels that use only ``tid.x``, ``shfl.sync.bfly`` and ``bar.sync`` (the CTA's, and the named
barriers of ``warp_specialize`` partitions), and fp8 values widened by ``cvt.rn.f16x2.e4m3x2`` /
``e5m2x2`` (modelled with ml_dtypes, as the interpreter computes them).

The NVPTX module (backend/lower/codegen.py) is rewritten for the host: address spaces dropped,
the dynamic shared memory ``@sparsile_smem`` defined as a buffer of the size code generation
reserved plus a poisoned guard, and the NVVM intrinsics and inline PTX above replaced by Python
callbacks. Each of
the ``32 * num_warps`` threads is an OS thread calling the JIT-compiled kernel (ctypes releases the
GIL while it runs): ``tid.x`` is the thread's index; a shuffle publishes the lane's value, waits
for the warp, reads lane ``l ^ mask`` and waits again (PTX ISA, "shfl.sync": every lane of the
full mask takes part); ``bar.sync 0`` waits for the CTA. Shared memory starts filled with a poison
byte, so a read of a slot nobody wrote gives garbage rather than a plausible zero.

Host threads are not scheduled as a GPU's warps are, so a missing barrier need not show in the
results; every shared-memory access therefore also reports (thread, barrier epoch, bytes) and the
run fails on a race: a byte that one thread writes and another reads in the same epoch (between
the same two barriers), or two threads write with different values, or a byte read that no thread
ever wrote.

Used by tests/backend/test_argmax_sim.py to check the three stages of backend/lower/reduce.py
together against the interpreter without a GPU.
"""

from __future__ import annotations

import ctypes
import re
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

GUARD = 256
POISON = 0xA5
_TIMEOUT_S = 60.0

_SHFL = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32)
_TID = ctypes.CFUNCTYPE(ctypes.c_int32)
_BAR = ctypes.CFUNCTYPE(None)


class _CTA:
    """The state the callbacks share while one launch runs."""

    def __init__(self, num_warps: int) -> None:
        self.num_warps = num_warps
        self.tls = threading.local()
        self.cta = threading.Barrier(32 * num_warps, timeout=_TIMEOUT_S)
        self.warps = [threading.Barrier(32, timeout=_TIMEOUT_S) for _ in range(num_warps)]
        self.slots = [[0] * 32 for _ in range(num_warps)]
        self.errors: list[str] = []
        self.named: dict[int, threading.Barrier] = {}
        self.epoch = [(0, 0)] * (32 * num_warps)  # (barrier id, how many passed) per thread
        self.written: dict[int, tuple[tuple[int, int], int, int]] = {}  # byte -> (epoch, thread, value)
        self.read: dict[int, tuple[tuple[int, int], set[int]]] = {}  # byte -> (epoch, threads)
        self.base = 0


_current: list[_CTA] = []
_lock = threading.Lock()
_lock_named = threading.Lock()


def _tid() -> int:
    return int(_current[0].tls.tid)


def _shfl(mask: int, value: int, lane_mask: int, clamp: int) -> int:
    cta = _current[0]
    tid = cta.tls.tid
    w, lane = divmod(tid, 32)
    if (mask & 0xFFFFFFFF) != 0xFFFFFFFF or clamp != 31:
        cta.errors.append(f"thread {tid}: shfl.sync.bfly with mask {mask:#x} clamp {clamp} is not modelled")
    try:
        cta.slots[w][lane] = value
        cta.warps[w].wait()
        got = cta.slots[w][lane ^ lane_mask]
        cta.warps[w].wait()
    except threading.BrokenBarrierError:
        cta.errors.append(f"thread {tid}: a warp's shuffle barrier broke (lanes shuffled different times)")
        return 0
    return got


def _bar() -> None:
    cta = _current[0]
    try:
        cta.cta.wait()
    except threading.BrokenBarrierError:
        cta.errors.append(f"thread {cta.tls.tid}: bar.sync broke (threads reached different barriers)")
    _passed(cta, 0)


def _passed(cta: _CTA, bar: int) -> None:
    tid = cta.tls.tid
    ep = cta.epoch[tid]
    cta.epoch[tid] = (bar, ep[1] + 1)


def _bar_all(bar: int) -> None:
    if bar == 0:
        _bar()
    else:
        _named_bar(bar, 32 * _current[0].num_warps)


def _named_bar(bar: int, count: int) -> None:
    """``bar.sync bar, count`` (a warp_specialize partition's barrier): ``count`` threads wait."""
    cta = _current[0]
    with _lock_named:
        b = cta.named.setdefault(bar, threading.Barrier(count, timeout=_TIMEOUT_S))
    try:
        if b.parties != count:
            raise threading.BrokenBarrierError
        b.wait()
    except threading.BrokenBarrierError:
        cta.errors.append(f"thread {cta.tls.tid}: bar.sync {bar}, {count} broke")
    _passed(cta, bar)


def _conflict(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether accesses of two threads in epochs ``a`` and ``b`` may race: the same epoch of one
    barrier, or epochs of different barriers (nothing orders them)."""
    return a == b or a[0] != b[0]


def _is_nan(data: bytes) -> bool:
    dt = {2: np.float16, 4: np.float32, 8: np.float64}.get(len(data))
    return dt is not None and bool(np.isnan(np.frombuffer(data, dt)[0]))


def _access(ptr: int, size: int, is_store: int) -> None:
    cta = _current[0]
    tid = cta.tls.tid
    ep = cta.epoch[tid]
    off = ptr - cta.base
    data = ctypes.string_at(ptr, size) if is_store else b""
    if is_store == 2 and _is_nan(data):  # the GPU's NaNs are canonical; the host's keep payload and sign
        data = bytes(size)
    for i in range(size):
        byte = off + i
        w = cta.written.get(byte)
        if is_store:
            r = cta.read.get(byte)
            if r is not None and _conflict(r[0], ep) and r[1] - {tid}:
                cta.errors.append(f"race: thread {tid} writes smem byte {byte} read by {sorted(r[1])[:4]} "
                                  f"in epoch {ep}")
            if w is not None and _conflict(w[0], ep) and w[1] != tid and w[2] != data[i]:
                cta.errors.append(f"race: threads {w[1]} and {tid} write different values to smem byte {byte} "
                                  f"in epoch {ep} ({w[2]:#x}, {data[i]:#x})")
            cta.written[byte] = (ep, tid, data[i])
        else:
            if w is None:
                cta.errors.append(f"thread {tid} reads smem byte {byte}, which no thread wrote")
            elif _conflict(w[0], ep) and w[1] != tid:
                cta.errors.append(f"race: thread {tid} reads smem byte {byte} written by {w[1]} in epoch {ep}")
            r = cta.read.get(byte)
            if r is None or r[0] != ep:
                cta.read[byte] = (ep, {tid})
            else:
                r[1].add(tid)


_ACCESS = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32)
_NAMED = ctypes.CFUNCTYPE(None, ctypes.c_int32, ctypes.c_int32)
_BAR_ALL = ctypes.CFUNCTYPE(None, ctypes.c_int32)
_CVT = ctypes.CFUNCTYPE(ctypes.c_uint32, ctypes.c_uint16)


def _cvt_fp8x2(name: str) -> Any:
    """``cvt.rn.f16x2.<name>x2 d, a``: the two fp8 values of ``a`` as f16 (exact), the high byte's
    in the high half (PTX ISA, "cvt"); ml_dtypes gives the values, as it does to the interpreter."""
    import sparsile as sp

    dt = getattr(sp, name).numpy_dtype

    def cvt(a: int) -> int:
        pair = np.array([a & 0xFF, a >> 8], np.uint8).view(dt).astype(np.float16).view(np.uint16)
        return int(pair[0]) | int(pair[1]) << 16

    return _CVT(cvt)


_CALLBACKS = (_TID(_tid), _SHFL(_shfl), _BAR(_bar), _ACCESS(_access), _NAMED(_named_bar), _BAR_ALL(_bar_all),
              _cvt_fp8x2("e4m3"), _cvt_fp8x2("e5m2"))
_SYMBOLS = {"sparsile_sim_tid": _CALLBACKS[0], "sparsile_sim_shfl": _CALLBACKS[1], "sparsile_sim_bar": _CALLBACKS[2],
            "sparsile_sim_smem": _CALLBACKS[3], "sparsile_sim_named_bar": _CALLBACKS[4],
            "sparsile_sim_bar_all": _CALLBACKS[5], "sparsile_sim_cvt_e4m3": _CALLBACKS[6],
            "sparsile_sim_cvt_e5m2": _CALLBACKS[7]}
_CVT_ASM = re.compile(r'call i32 asm "cvt\.rn\.f16x2\.(e4m3|e5m2)x2 \$0, \$1;", "=r,h"\(i16 ')
_NAMED_ASM = re.compile(r'call void asm sideeffect "bar\.sync (\d+), (\d+);", ""\(\)')
_INTRINSICS = {"llvm.nvvm.read.ptx.sreg.tid.x": "sparsile_sim_tid", "llvm.nvvm.shfl.sync.bfly.i32": "sparsile_sim_shfl",
               "llvm.nvvm.barrier0": "sparsile_sim_bar",
               # what the optimizer upgrades barrier0 to (its operand: the barrier id, 0 here)
               "llvm.nvvm.barrier.cta.sync.aligned.all": "sparsile_sim_bar_all"}
_SCALAR_BYTES = {"i1": 1, "i8": 1, "i16": 2, "half": 2, "bfloat": 2, "i32": 4, "float": 4, "i64": 8, "double": 8}
_FLOATS = ("half", "float", "double")
_TYPE = r"(<\d+ x \w+>|\w+)"
_PTR = r"(%[\w.]+|@sparsile_smem|getelementptr [\w ]*\(i8, ptr addrspace\(3\) @sparsile_smem, i\d+ \d+\))"
_STORE = re.compile(rf"^(\s*)store {_TYPE} ([^,]+), ptr addrspace\(3\) {_PTR}(.*)$", re.M)
_LOAD = re.compile(rf"^(\s*)(%[\w.]+) = load {_TYPE}, ptr addrspace\(3\) {_PTR}(.*)$", re.M)


def _nbytes(ty: str) -> int:
    m = re.fullmatch(r"<(\d+) x (\w+)>", ty)
    return int(m.group(1)) * _SCALAR_BYTES[m.group(2)] if m else _SCALAR_BYTES[ty]


def _instrument(text: str) -> str:
    """Each shared-memory load and store reported to :func:`_access` (after a store, before a load;
    ``2`` marks a float store, whose NaNs all count as one value)."""
    accesses = re.findall(r"^\s*(?:store |%[\w.]+ = load ).*ptr addrspace\(3\)", text, re.M)
    if len(accesses) != len(_STORE.findall(text)) + len(_LOAD.findall(text)):
        raise NotImplementedError("a shared-memory access the warp simulator cannot instrument")
    def store(m: re.Match[str]) -> str:
        kind = 2 if m.group(2) in _FLOATS else 1
        return (f"{m.group(0)}\n{m.group(1)}call void @sparsile_sim_smem(ptr addrspace(3) {m.group(4)}, "
                f"i32 {_nbytes(m.group(2))}, i32 {kind})")

    text = _STORE.sub(store, text)
    text = _LOAD.sub(lambda m: f"{m.group(1)}call void @sparsile_sim_smem(ptr addrspace(3) {m.group(4)}, "
                               f"i32 {_nbytes(m.group(3))}, i32 0)\n{m.group(0)}", text)
    return text + "\ndeclare void @sparsile_sim_smem(ptr, i32, i32)\n"
def host_module(llvm_text: str, smem_bytes: int) -> str:
    """The NVPTX module ``llvm_text`` rewritten for the host (see the module docstring)."""
    text = re.sub(r"^target (triple|datalayout) = .*$", "", llvm_text, flags=re.M)
    for name in re.findall(r"@(llvm\.nvvm\.[\w.]+)", text):
        if name not in _INTRINSICS:
            raise NotImplementedError(f"the warp simulator does not model {name}")
    text = _NAMED_ASM.sub(r"call void @sparsile_sim_named_bar(i32 \1, i32 \2)", text)
    text = _CVT_ASM.sub(r"call i32 @sparsile_sim_cvt_\1(i16 ", text)
    if " asm " in text:
        raise NotImplementedError("the warp simulator does not model inline PTX (but named bar.sync)")
    text += ("\ndeclare void @sparsile_sim_named_bar(i32, i32)\ndeclare i32 @sparsile_sim_cvt_e4m3(i16)\n"
             "declare i32 @sparsile_sim_cvt_e5m2(i16)\n")
    for name, repl in _INTRINSICS.items():
        text = text.replace(f"@{name}(", f"@{repl}(")
    text = _instrument(text)
    text = re.sub(r"\s*addrspace\(\d+\)", "", text)
    text = re.sub(r'"target-(cpu|features)"="[^"]*"', "", text)
    text = text.replace("define ptx_kernel ", "define ")
    size = smem_bytes + GUARD
    text, n = re.subn(r"@sparsile_smem = external (local_unnamed_addr )?global \[0 x i8\]",
                      f"@sparsile_smem = global [{size} x i8] zeroinitializer", text)
    if not n:  # the optimizer dropped it (unused): define it all the same, for the guard check
        text += f"\n@sparsile_smem = global [{size} x i8] zeroinitializer, align 1024\n"
    return text


def host_engine(text: str, opt: int = 0) -> Any:
    """An MCJIT engine for the LLVM IR ``text`` with the host CPU's features (f16 conversions
    inline, where the plain target would call a runtime helper MCJIT cannot resolve) and the
    simulator's intrinsics resolvable."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    for name, fn in _SYMBOLS.items():
        llvm.add_symbol(name, ctypes.cast(fn, ctypes.c_void_p).value)
    module = llvm.parse_assembly(text)
    module.verify()
    machine = llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=opt)
    engine = llvm.create_mcjit_compiler(module, machine)
    engine.finalize_object()
    return engine


def nvptx_optimized(llvm_text: str, target: str = "sm_90a", opt_level: int = 3) -> str:
    """``llvm_text`` after the ``O<opt_level>`` pipeline the PTX path runs for ``target``
    (backend/toolchain/llvm_to_ptx.py): what the NVPTX code generator sees, so that a rewrite the
    optimizer makes on the GPU's path (exploiting ``poison``, ``inbounds``, ``disjoint``, ...) runs
    here too."""
    import llvmlite.binding as llvm

    from ...backend.toolchain.llvm_to_ptx import _LLVM_LOCK, _target_machine, parse_module
    from ...target.targets import get_target

    tgt = get_target(target)
    with _LLVM_LOCK:
        module = parse_module(llvm_text)
        tm = _target_machine(tgt.llvm_cpu, tgt.llvm_features, opt_level)
        module.data_layout = str(tm.target_data)
        builder = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=opt_level))
        builder.getModulePassManager().run(module, builder)
        return str(module)


def _signature(text: str) -> tuple[str, list[str]]:
    """The kernel's name and its parameters (split at the commas outside parentheses)."""
    m = re.search(r"^define [^@]*@(\w+)\(", text, re.M)
    assert m is not None
    params, depth, cur = [], 0, ""
    for ch in text[m.end():]:
        if ch == ")" and depth == 0:
            break
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            params.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        params.append(cur.strip())
    return m.group(1), params


def run_cta(llvm_text: str, smem_bytes: int, num_warps: int, args: Sequence[np.ndarray]) -> None:
    """Run kernel ``llvm_text`` (its only function; every parameter a pointer, passed ``args``)
    for one CTA of ``num_warps`` warps. Raises AssertionError if a thread failed, a barrier
    deadlocked, or shared memory past ``smem_bytes`` was written."""
    host = host_module(llvm_text, smem_bytes)
    name, params = _signature(host)
    n_params = len(params)
    assert n_params == len(args), (params, len(args))
    assert all(p.startswith("ptr") for p in params), params
    engine = host_engine(host)
    smem_addr = engine.get_global_value_address("sparsile_smem")
    assert smem_addr, "no shared memory buffer"
    smem = (ctypes.c_uint8 * (smem_bytes + GUARD)).from_address(smem_addr)
    ctypes.memset(smem_addr, POISON, smem_bytes + GUARD)
    fn = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * n_params))(engine.get_function_address(name))
    ptrs = [a.ctypes.data for a in args]
    with _lock:
        cta = _CTA(num_warps)
        cta.base = smem_addr
        _current[:] = [cta]

        def worker(tid: int) -> None:
            cta.tls.tid = tid
            try:
                fn(*ptrs)
            except Exception as e:  # pragma: no cover - reported below
                cta.errors.append(f"thread {tid}: {e!r}")

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(32 * num_warps)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        _current.clear()
    assert not cta.errors, cta.errors[:4]
    assert not cta.cta.broken and not any(b.broken for b in cta.warps), "a barrier broke (deadlock or error)"
    guard = bytes(smem[smem_bytes:])
    assert guard == bytes([POISON]) * GUARD, "shared memory written past what code generation reserved"
    del engine
