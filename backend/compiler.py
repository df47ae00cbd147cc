"""The compilation pipeline, in one readable list.

``source -> AST -> sema -> typed IR`` happens in the frontend (``Kernel.ir_for``); from there::

    verify IR
    -> layout inference         (frontend/layout_inference.py; tensor-core anchors from the target)
    -> legality                 (frontend/legality.py, per target; diagnostics at the user's lines)
    -> verify IR
    -> LLVM IR                  (backend/codegen.py + lower_*.py)
    -> PTX                      (backend/llvm_to_ptx.py, intrinsics gated by target first)
    -> cubin                    (backend/linker.py, nvJitLink)

Results are cached in memory and on disk (backend/cache.py), keyed by source, specialization,
target, options and toolchain versions.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..frontend.ir import Function
from ..frontend.ir_printer import print_function
from ..frontend.ir_verify import verify_function
from .codegen import KernelParam, generate_llvm
from .targets import Target, get_target

PASSES: list[tuple[str, Callable[..., Any]]] = []


@dataclass
class CompiledKernel:
    """Everything the launcher and the tools need about one specialization of a kernel."""

    name: str
    target: str
    num_warps: int
    smem_bytes: int
    params: list[KernelParam]
    ir: str = ""
    llvm: str = ""
    ptx: str = ""
    cubin: bytes = b""
    info_log: str = ""
    cluster: tuple[int, int, int] = (1, 1, 1)
    timings: dict[str, float] = field(default_factory=dict)
    tensormaps: list[dict[str, Any]] = field(default_factory=list)

    def metadata(self) -> dict[str, Any]:
        return {"name": self.name, "target": self.target, "num_warps": self.num_warps,
                "smem_bytes": self.smem_bytes, "cluster": list(self.cluster),
                "params": [[p.name, p.kind, p.dtype, p.index, _jsonable(p.extra)] for p in self.params],
                "tensormaps": self.tensormaps, "info_log": self.info_log}

    @staticmethod
    def from_cache(meta: dict[str, Any], blobs: dict[str, bytes]) -> CompiledKernel:
        params = [KernelParam(n, k, d, i, _unjson(e)) for n, k, d, i, e in meta["params"]]
        return CompiledKernel(meta["name"], meta["target"], meta["num_warps"], meta["smem_bytes"], params,
                              blobs.get("ir", b"").decode(), blobs.get("llvm", b"").decode(),
                              blobs.get("ptx", b"").decode(), blobs.get("cubin", b""), meta.get("info_log", ""),
                              tuple(meta.get("cluster", (1, 1, 1))), {}, meta.get("tensormaps", []))  # type: ignore[arg-type]


def _jsonable(x: Any) -> Any:
    if isinstance(x, tuple):
        return {"__tuple__": [_jsonable(e) for e in x]}
    return x


def _unjson(x: Any) -> Any:
    if isinstance(x, dict) and "__tuple__" in x:
        return tuple(_unjson(e) for e in x["__tuple__"])
    return x


def run_passes(func: Function, target: Target, num_warps: int) -> dict[str, Any]:
    """Layout inference and legality over verified IR; returns state for code generation."""
    from ..frontend.layout_inference import infer_layouts

    verify_function(func)
    state: dict[str, Any] = {}
    hooks = _target_hooks(target)
    if hooks.get("prepare") is not None:
        state.update(hooks["prepare"](func, target, num_warps) or {})
    infer_layouts(func, num_warps, hooks.get("anchor"))
    try:
        from ..frontend.legality import check_legality
    except ModuleNotFoundError:
        check_legality = None  # type: ignore[assignment]
    if check_legality is not None:
        check_legality(func, target, num_warps)
    verify_function(func)
    return state


def _target_hooks(target: Target) -> dict[str, Any]:
    from .targets import Feature

    if target.has(Feature.WGMMA):
        try:
            from .lower_hopper import HOOKS

            return HOOKS
        except ModuleNotFoundError:
            return {}
    if target.has(Feature.TCGEN05):
        from .lower_blackwell import HOOKS as BLACKWELL_HOOKS

        return BLACKWELL_HOOKS
    return {}


def compile_function(func: Function, target: Target | str, *, num_warps: int = 4, stop_after: str = "cubin",
                     source_key: str | None = None) -> CompiledKernel:
    """Compile a specialized kernel's IR down to ``stop_after`` (``ir``, ``llvm``, ``ptx`` or
    ``cubin``)."""
    from .linker import ptx_to_cubin
    from .llvm_to_ptx import llvm_ir_to_ptx

    tgt = get_target(target) if isinstance(target, str) else target
    t0 = time.perf_counter()
    state = run_passes(func, tgt, num_warps)
    ir_text = print_function(func)
    t1 = time.perf_counter()
    ck = CompiledKernel(func.name, tgt.name, num_warps, 0, [], ir=ir_text)
    ck.timings["passes"] = t1 - t0
    if stop_after == "ir":
        return ck
    llvm_text, cg = generate_llvm(func, tgt, num_warps, state)
    ck.llvm, ck.params, ck.smem_bytes = llvm_text, cg.params, cg.smem_bytes
    ck.cluster = tuple(cg.state.get("cluster", (1, 1, 1)))  # type: ignore[assignment]
    ck.tensormaps = cg.state.get("tensormap_specs", [])
    t2 = time.perf_counter()
    ck.timings["llvm"] = t2 - t1
    if stop_after == "llvm":
        return ck
    ck.ptx = llvm_ir_to_ptx(llvm_text, tgt)
    t3 = time.perf_counter()
    ck.timings["ptx"] = t3 - t2
    if stop_after == "ptx":
        return ck
    res = ptx_to_cubin(ck.ptx, tgt, name=f"{func.name}.ptx")
    ck.cubin, ck.info_log = res.cubin, res.info_log
    ck.timings["cubin"] = time.perf_counter() - t3
    return ck


def compile_cached(kernel: Any, bindings: dict[str, Any], key: tuple, target: Target, options: dict[str, Any]
                   ) -> CompiledKernel:
    """Compile (or fetch from the cache) one specialization of a kernel for ``target``."""
    from .cache import default_cache, make_key

    num_warps = int(options.get("num_warps") or 4)
    ckey = make_key(target=target.name, source=kernel.source.text, kernel_name=kernel.name,
                    specialization=repr(key), options=repr(sorted((k, repr(v)) for k, v in options.items())))
    cache = default_cache()
    entry = cache.get(ckey)
    if entry is not None:
        try:
            return CompiledKernel.from_cache(entry.metadata, entry.blobs)
        except (KeyError, TypeError, ValueError, AttributeError, UnicodeDecodeError):
            cache.discard(ckey)  # a checksum-valid entry with unusable metadata: rebuild it
    ck = compile_function(kernel.fresh_ir(bindings, options), target, num_warps=num_warps)
    cache.put(ckey, {"cubin": ck.cubin, "ptx": ck.ptx.encode()}, json.loads(json.dumps(ck.metadata())))
    return ck


def compile_kernel(kernel: Any, signature: dict[str, Any] | str | None, *, target: str | None = None,
                   stop_after: str = "cubin", **options: Any) -> CompiledKernel:
    """Ahead-of-time compilation of ``kernel`` for ``signature`` (no GPU needed): a dict (name ->
    type or constexpr value) or the text ``sparsile compile --signature`` takes, e.g.
    ``"x=ptr[f32], n=i32, BLOCK=1024"``."""
    from ..frontend.diagnostics import LaunchError
    from ..frontend.kernel import KERNEL_OPTIONS
    from ..frontend.specialize import parse_signature

    if isinstance(signature, str):
        signature = parse_signature(signature, kernel.globals)
    elif signature is not None and not isinstance(signature, dict):
        raise LaunchError("SP0724", f"the signature of `{kernel.name}` must be a dict or a text such as "
                          f"\"x=ptr[f32], n=i32\", found {type(signature).__name__}")
    bindings, _ = kernel.signature_bindings(signature or {})
    opts = {**KERNEL_OPTIONS, **kernel.options, **options}
    tgt = get_target(target or opts.get("target") or "sm_90a")
    return compile_function(kernel.fresh_ir(bindings, opts), tgt, num_warps=int(opts.get("num_warps") or 4),
                            stop_after=stop_after)
