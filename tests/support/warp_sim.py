"""Run a kernel's LLVM IR on the host CPU, one CTA, every thread at once: a model of the GPU for
kernels that use only ``tid.x``, ``shfl.sync.bfly`` and ``bar.sync`` (the CTA's, and the named
barriers of ``warp_specialize`` partitions), and fp8 values widened by ``cvt.rn.f16x2.e4m3x2`` /
``e5m2x2`` (modelled with ml_dtypes, as the interpreter computes them).

The NVPTX module (backend/lower/codegen.py) is rewritten for the host: address spaces dropped,
the dynamic shared memory ``@sparsile_smem`` defined as a buffer of the size code generation
reserved plus a poisoned guard, and the NVVM intrinsics and inline PTX above replaced by calls
into the simulator's runtime. Each of the ``32 * num_warps`` threads runs the JIT-compiled kernel as a fiber of its
own (tests/support/warp_fibers.py), all on the calling OS thread; a callback hands a request to
the scheduler here, which answers it or, where the thread must wait, runs other threads until it
may go on. ``tid.x`` is the thread's index; a shuffle waits for every lane of the warp, then each
reads lane ``l ^ mask`` (PTX ISA, "shfl.sync": every lane of the full mask takes part);
``bar.sync 0`` waits for the CTA, ``bar.sync id, count`` for ``count`` threads. When no thread can
run and some still wait, the launch deadlocked (lanes that shuffle different numbers of times,
threads at different barriers): an error, found at once; the waiting threads then run on, every
barrier and shuffle returning at once (a shuffle reads 0). Shared memory starts filled with a
poison byte, so a read of a slot nobody wrote gives garbage rather than a plausible zero.

The simulator does not schedule threads as a GPU does its warps, so a missing barrier need not
show in the results; every shared-memory access is therefore also logged (thread, barrier epoch,
bytes) and the run fails on a race (tests/support/warp_races.py, at the end of the launch): a byte
that one thread writes and another reads in the same epoch (between the same two barriers), or two
threads write with different values, or a byte read that no thread ever wrote.

Used by tests/backend/test_argmax_sim.py to check the three stages of backend/lower/reduce.py
together against the interpreter without a GPU.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import warp_fibers
from .warp_cta import CTA

GUARD = 256
POISON = 0xA5
_CALLBACK = re.compile(r"^declare [^@]*@sparsile_sim_\w+\(.*$", re.M)  # the renamed intrinsics' declarations

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
    """Each shared-memory load and store reported to the simulator (warp_cta.CTA) (after a store, before a load;
    ``2`` marks a float store, whose NaNs all count as one value)."""
    accesses = re.findall(r"^\s*(?:store |%[\w.]+ = load ).*ptr addrspace\(3\)", text, re.M)
    if len(accesses) != len(_STORE.findall(text)) + len(_LOAD.findall(text)):
        raise NotImplementedError("a shared-memory access the warp simulator cannot instrument")
    if any(_nbytes(m.group(2)) > 16 for m in _STORE.finditer(text)) or \
            any(_nbytes(m.group(3)) > 16 for m in _LOAD.finditer(text)):
        raise NotImplementedError("a shared-memory access of more than 16 bytes (the simulator logs at most 16)")
    def store(m: re.Match[str]) -> str:
        kind = 2 if m.group(2) in _FLOATS else 1
        return (f"{m.group(0)}\n{m.group(1)}call void @sparsile_sim_smem(ptr addrspace(3) {m.group(4)}, "
                f"i32 {_nbytes(m.group(2))}, i32 {kind})")

    text = _STORE.sub(store, text)
    text = _LOAD.sub(lambda m: f"{m.group(1)}call void @sparsile_sim_smem(ptr addrspace(3) {m.group(4)}, "
                               f"i32 {_nbytes(m.group(3))}, i32 0)\n{m.group(0)}", text)
    return text


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
    name, params = _signature(text)
    memcpy = "declare void @llvm.memcpy.p0.p0.i64(" not in text
    return _CALLBACK.sub("", text) + warp_fibers.runtime_ir(name, len(params), declare_memcpy=memcpy)


def host_engine(text: str, opt: int = 0) -> Any:
    """An MCJIT engine for the LLVM IR ``text`` with the host CPU's features (f16 conversions
    inline, where the plain target would call a runtime helper MCJIT cannot resolve) and glibc's
    context functions, which the simulator's fibers switch with, resolvable."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    warp_fibers.register_symbols()
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
    for one CTA of ``num_warps`` warps. Raises AssertionError on a race, a deadlock, a shuffle
    or barrier not modelled, or shared memory written past ``smem_bytes``."""
    if not warp_fibers.SUPPORTED:
        raise NotImplementedError("the warp simulator's fibers need Linux with glibc on x86_64 or aarch64")
    host = host_module(llvm_text, smem_bytes)
    _, params = _signature(host)
    n_params = len(params)
    assert n_params == len(args), (params, len(args))
    assert all(p.startswith("ptr") for p in params), params
    engine = host_engine(host)
    smem_addr = engine.get_global_value_address("sparsile_smem")
    assert smem_addr, "no shared memory buffer"
    smem = (ctypes.c_uint8 * (smem_bytes + GUARD)).from_address(smem_addr)
    ctypes.memset(smem_addr, POISON, smem_bytes + GUARD)
    with warp_fibers.Fibers(engine, 32 * num_warps, [a.ctypes.data for a in args]) as fibers:
        cta = CTA(num_warps, smem_addr, fibers)
        cta.run()
    assert not cta.errors, cta.errors[:4]
    guard = bytes(smem[smem_bytes:])
    assert guard == bytes([POISON]) * GUARD, "shared memory written past what code generation reserved"
    del engine
