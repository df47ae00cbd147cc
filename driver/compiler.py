"""The compile pipeline from text to cubin: its stages, in order, in one list (``PIPELINE``).

::

    parse       .spk / Python text -> Lark parse tree           frontend/syntax/parser.py
    build       parse tree -> AST (syntax diagnostics SP01xx)   frontend/syntax/builder.py
    specialize  arguments or a signature -> sema bindings       frontend/sema/specialize.py
    sema        AST + bindings -> typed tile IR                 frontend/sema/core.py
    layout      layout inference (the target's anchors)         frontend/layout/inference.py
    legality    the target's legality rules                     frontend/legality/core.py
    llvm        laid-out IR -> LLVM IR                          backend/lower/codegen.py
    ptx         LLVM IR -> PTX                                  backend/toolchain/llvm_to_ptx.py
    cubin       PTX -> cubin (nvJitLink; setmaxnreg: ptxas)     backend/toolchain/linker.py

``parse`` and ``build`` run when a module is loaded (``sparsile.load``, ``@jit``), ``specialize`` and
``sema`` when a kernel is specialized (``Kernel.fresh_ir``), the rest here (:func:`compile_function`).
``SPARSILE_DUMP_AFTER=stage[,stage]`` or ``sparsile compile --dump-after STAGE`` prints the program
after those stages (frontend/dump.py); a compile that dumps a stage from specialize on bypasses
the compile cache.

Results are cached in memory and on disk (driver/cache.py), keyed by source, specialization,
target, options, toolchain versions and what a ``@jit`` kernel captured from Python (its globals,
closure values and inlined helpers: frontend/sema/captures.py).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import warnings
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..backend.lower.codegen import KernelParam, generate_llvm
from ..backend.lower.hooks import hooks_for
from ..frontend.diagnostics import CompileError, Diagnostic, LaunchError
from ..frontend.dump import ENV_DUMP_AFTER, dump, requested_stages
from ..frontend.ir.core import Function
from ..frontend.ir.printer import print_function
from ..frontend.ir.verify import verify_function
from ..frontend.layout.inference import infer_layouts
from ..frontend.legality.core import check_legality
from ..frontend.sema.specialize import parse_signature
from ..target.hooks import PreparedState
from ..target.targets import Target, get_target
from .cache import default_cache, make_key
from .kernel import Kernel
from .kernel_options import KERNEL_OPTIONS, check_options


@dataclass(frozen=True)
class Stage:
    """One stage of the pipeline: its name (for ``--dump-after``), what it does, where it lives."""

    name: str
    does: str
    where: str


PIPELINE: tuple[Stage, ...] = (
    Stage("parse", "text -> Lark parse tree", "frontend/syntax/parser.py"),
    Stage("build", "parse tree -> AST", "frontend/syntax/builder.py"),
    Stage("specialize", "arguments or a signature -> sema bindings", "frontend/sema/specialize.py"),
    Stage("sema", "AST + bindings -> typed tile IR", "frontend/sema/core.py"),
    Stage("layout", "layout inference, anchored by the target's hooks", "frontend/layout/inference.py"),
    Stage("legality", "the target's legality rules", "frontend/legality/core.py"),
    Stage("llvm", "laid-out IR -> LLVM IR", "backend/lower/codegen.py"),
    Stage("ptx", "LLVM IR -> PTX", "backend/toolchain/llvm_to_ptx.py"),
    Stage("cubin", "PTX -> cubin", "backend/toolchain/linker.py"),
)
"""Every stage from text to cubin, in order (docs/architecture.md)."""
STAGE_NAMES = tuple(stage.name for stage in PIPELINE)
FRESH_STAGES = frozenset(STAGE_NAMES[STAGE_NAMES.index("specialize"):])
"""The stages a compile runs for each specialization (a cache hit skips them: a dump of one of
them compiles anew)."""


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
    pdl: bool = False
    """Launched as a programmatic dependent launch (the ``pdl=True`` option: docs/language.md,
    "Programmatic dependent launch")."""
    timings: dict[str, float] = field(default_factory=dict)
    tensormaps: list[dict[str, Any]] = field(default_factory=list)
    inflight_span: Any = None
    """The first ``hopper.wgmma_wait(n > 0, ...)`` of the source: where SP0370 points when the PTX
    check finds an in-flight metadata register written (backend/toolchain/ptx_inflight.py)."""

    def metadata(self) -> dict[str, Any]:
        return {"name": self.name, "target": self.target, "num_warps": self.num_warps,
                "smem_bytes": self.smem_bytes, "cluster": list(self.cluster), "pdl": self.pdl,
                "params": [[p.name, p.kind, p.dtype, p.index, _jsonable(p.extra)] for p in self.params],
                "tensormaps": self.tensormaps, "info_log": self.info_log}

    @staticmethod
    def from_cache(meta: dict[str, Any], blobs: dict[str, bytes]) -> CompiledKernel:
        params = [KernelParam(n, k, d, i, _unjson(e)) for n, k, d, i, e in meta["params"]]
        return CompiledKernel(meta["name"], meta["target"], meta["num_warps"], meta["smem_bytes"], params,
                              blobs.get("ir", b"").decode(), blobs.get("llvm", b"").decode(),
                              blobs.get("ptx", b"").decode(), blobs.get("cubin", b""), meta.get("info_log", ""),
                              tuple(meta.get("cluster", (1, 1, 1))), bool(meta.get("pdl", False)),  # type: ignore[arg-type]
                              {}, meta.get("tensormaps", []))


def _jsonable(x: Any) -> Any:
    if isinstance(x, tuple):
        return {"__tuple__": [_jsonable(e) for e in x]}
    return x


def _unjson(x: Any) -> Any:
    if isinstance(x, dict) and "__tuple__" in x:
        return tuple(_unjson(e) for e in x["__tuple__"])
    return x


def run_passes(func: Function, target: Target, num_warps: int) -> PreparedState:
    """The target's prepare hook, layout inference and legality over verified IR; returns what the
    prepare hook hands to code generation (``generate_llvm``)."""
    verify_function(func)
    hooks = hooks_for(target)
    prepared = hooks.prepare(func, target, num_warps) if hooks.prepare is not None else None
    infer_layouts(func, num_warps, hooks.anchor)
    dump("layout", func.name, lambda: print_function(func))
    check_legality(func, target, num_warps, hooks)
    verify_function(func)
    dump("legality", func.name, lambda: print_function(func))
    return prepared if prepared is not None else PreparedState()


def _warn_unknown_dumps() -> None:
    """A name in SPARSILE_DUMP_AFTER that is no stage would silently dump nothing: say so."""
    unknown = sorted(requested_stages() - set(STAGE_NAMES))
    if unknown:
        warnings.warn(f"{ENV_DUMP_AFTER}: no stage named {', '.join(unknown)}; the stages are "
                      f"{', '.join(STAGE_NAMES)}", stacklevel=3)


STAGES = ("ir", "llvm", "ptx", "cubin")
"""The stages of :func:`compile_function`, in order; the compile cache keeps the last three."""


def compile_function(func: Function, target: Target | str, *, num_warps: int = 4, stop_after: str = "cubin",
                     source_key: str | None = None) -> CompiledKernel:
    """Compile a specialized kernel's IR down to ``stop_after`` (``ir``, ``llvm``, ``ptx`` or
    ``cubin``)."""
    tgt = get_target(target) if isinstance(target, str) else target
    _warn_unknown_dumps()
    t0 = time.perf_counter()
    prepared = run_passes(func, tgt, num_warps)
    ir_text = print_function(func)
    t1 = time.perf_counter()
    ck = CompiledKernel(func.name, tgt.name, num_warps, 0, [], ir=ir_text, pdl=bool(func.attrs.get("pdl")))
    ck.inflight_span = next((op.span for op in func.walk()
                             if op.name == "hopper.wgmma_wait" and op.attrs.get("pending", 0) > 0), None)
    ck.timings["passes"] = t1 - t0
    if stop_after == "ir":
        return ck
    llvm_text, cg = generate_llvm(func, tgt, num_warps, prepared)
    dump("llvm", func.name, lambda: llvm_text)
    ck.llvm, ck.params, ck.smem_bytes = llvm_text, cg.params, cg.smem_bytes
    ck.cluster = cg.state.cluster or (1, 1, 1)  # type: ignore[assignment]  (legality: 3 dimensions)
    ck.timings["llvm"] = time.perf_counter() - t1
    return finish_stages(ck, tgt, stop_after)


def finish_stages(ck: CompiledKernel, tgt: Target, stop_after: str) -> CompiledKernel:
    """Carry ``ck`` (which has its LLVM IR, and maybe its PTX) on to ``stop_after``."""
    from ..backend.toolchain.linker import ptx_to_cubin
    from ..backend.toolchain.llvm_to_ptx import llvm_ir_to_ptx
    from ..backend.toolchain.ptx_inflight import check_ptx

    if stop_after in ("ptx", "cubin") and not ck.ptx:
        t = time.perf_counter()
        ptx = llvm_ir_to_ptx(ck.llvm, tgt)
        dump("ptx", ck.name, lambda: ptx)
        check_ptx(ptx, ck.name, ck.inflight_span)  # SP0370 where LLVM shared an in-flight metadata register
        ck.ptx = ptx
        ck.timings["ptx"] = time.perf_counter() - t
    if stop_after == "cubin" and not ck.cubin:
        t = time.perf_counter()
        res = ptx_to_cubin(ck.ptx, tgt, name=f"{ck.name}.ptx")
        ck.cubin, ck.info_log = res.cubin, res.info_log
        ck.timings["cubin"] = time.perf_counter() - t
        dump("cubin", ck.name, lambda: f"{len(ck.cubin)} bytes of ELF for {tgt.name}\n{ck.info_log}")
    return ck


def _has_stage(ck: CompiledKernel, stage: str) -> bool:
    return bool(getattr(ck, stage)) if stage in ("llvm", "ptx", "cubin") else False


LLVM_BLOB = "llvm.z"
"""The cache entry's blob of zlib-compressed LLVM IR."""


_COMPILING_LOCK = threading.Lock()
_compiling: dict[str, list[Any]] = {}
"""Cache keys being compiled now: key -> [the lock its compiling thread holds, threads using it]."""


@contextlib.contextmanager
def _compiling_once(ckey: str) -> Iterator[None]:
    """Held while this thread compiles ``ckey``: a second thread compiling the same key waits for the
    first (and then finds its entry in the cache) instead of compiling it again."""
    with _COMPILING_LOCK:
        slot = _compiling.setdefault(ckey, [threading.Lock(), 0])
        slot[1] += 1
    try:
        with slot[0]:
            yield
    finally:
        with _COMPILING_LOCK:
            slot[1] -= 1
            if not slot[1]:
                del _compiling[ckey]


def _from_cache(cache: Any, ckey: str, stop_after: str,
                count: bool = True) -> tuple[CompiledKernel | None, CompiledKernel | None]:
    """(the cached kernel where it reaches ``stop_after``, else None; a cached kernel that stops at an
    earlier stage with its LLVM IR, to carry on from, else None)."""
    entry = cache.get(ckey, count=count)
    if entry is None:
        return None, None
    try:
        ck = CompiledKernel.from_cache(entry.metadata, entry.blobs)
        if LLVM_BLOB in entry.blobs:
            ck.llvm = zlib.decompress(entry.blobs[LLVM_BLOB]).decode()
    except (KeyError, TypeError, ValueError, AttributeError, UnicodeDecodeError, zlib.error):
        cache.discard(ckey)  # a checksum-valid entry with unusable metadata: rebuild it
        return None, None
    if _has_stage(ck, stop_after):
        return ck, None
    return None, (ck if ck.llvm else None)


def cache_key(kernel: Any, bindings: dict[str, Any], key: tuple, target: Target, options: dict[str, Any]) -> str:
    """The compile cache's key of one specialization (:func:`compile_cached`)."""
    captures = kernel.captures_for(bindings, key, options)
    return make_key(target=target.name, source=kernel.source_key, kernel_name=kernel.name,
                    specialization=repr(key), options=repr(sorted((k, repr(v)) for k, v in options.items())),
                    captures=captures.disk_key())


def compile_cached(kernel: Any, bindings: dict[str, Any], key: tuple, target: Target, options: dict[str, Any],
                   *, stop_after: str = "cubin", keep_llvm: bool = False) -> CompiledKernel:
    """Compile (or fetch from the compile cache) one specialization of a kernel for ``target``, down
    to ``stop_after`` (``llvm``, ``ptx`` or ``cubin``; an entry with an earlier stage only is
    carried on and stored again). The key holds the kernel's source, the specialization, the
    options, the target and, for a ``@jit`` kernel, every Python value it captured
    (frontend/sema/captures.py), so that a changed global never reuses a stale cubin. The entry keeps
    the IR, PTX and cubin; the LLVM IR (often 20 times the PTX) only with ``keep_llvm`` (ahead of
    time compiles, which return it), compressed. Thread-safe: two threads compiling one key at once
    compile it once (:func:`_compiling_once`); different keys compile in parallel."""

    num_warps = int(options.get("num_warps") or 4)
    ckey = cache_key(kernel, bindings, key, target, options)
    cache = default_cache()
    fresh = bool(requested_stages() & FRESH_STAGES)  # a dump needs a fresh compile
    partial = None
    if not fresh:
        done, partial = _from_cache(cache, ckey, stop_after)
        if done is not None:
            return done
    with _compiling_once(ckey):
        if not fresh:  # another thread may have compiled it meanwhile (a second look: not a second miss)
            done, partial = _from_cache(cache, ckey, stop_after, count=False)
            if done is not None:
                return done
        return _compile_and_store(kernel, bindings, target, options, num_warps, stop_after, keep_llvm, cache, ckey,
                                  partial)


def _compile_and_store(kernel: Any, bindings: dict[str, Any], target: Target, options: dict[str, Any],
                       num_warps: int, stop_after: str, keep_llvm: bool, cache: Any, ckey: str,
                       partial: CompiledKernel | None) -> CompiledKernel:
    """Compile (carrying on ``partial``, a cached entry that stops at an earlier stage, where given)
    and store the entry under ``ckey``."""
    ck = partial if partial is not None else \
        compile_function(kernel.fresh_ir(bindings, options), target, num_warps=num_warps, stop_after="llvm")
    ck = finish_stages(ck, target, stop_after)
    blobs = {name: getattr(ck, name).encode() for name in ("ir", "ptx") if getattr(ck, name)}
    if ck.cubin:
        blobs["cubin"] = ck.cubin
    if ck.llvm and (keep_llvm or stop_after == "llvm"):
        blobs[LLVM_BLOB] = zlib.compress(ck.llvm.encode(), 1)
    cache.put(ckey, blobs, json.loads(json.dumps(ck.metadata())))
    return ck


def compile_kernel(kernel: Any, signature: dict[str, Any] | str | None, *, target: str | None = None,
                   stop_after: str = "cubin", cache: bool = True, **options: Any) -> CompiledKernel:
    """Ahead-of-time compilation of ``kernel`` for ``signature`` (no GPU needed): a dict (name ->
    type or constexpr value) or the text ``sparsile compile --signature`` takes, e.g.
    ``"x=ptr[f32], n=i32, BLOCK=1024"``. Parameters the signature leaves out take their annotation
    (run-time) or default (constexpr). Compiles to ``llvm``, ``ptx`` and ``cubin`` go through the
    same compile cache as ``kernel[grid]`` (``cache=False`` compiles anew, for benchmarks)."""

    if not isinstance(kernel, Kernel):  # a name, a helper or None was an AttributeError
        raise LaunchError("SP0724", f"compile_kernel needs a kernel, found {type(kernel).__name__}",
                          help="a `@kernel` of a .spk module (`sparsile.load(path).kernels[name]`) or a "
                               "`@sparsile.jit` function")
    if isinstance(target, str) and not target.strip():  # "" used to compile for sm_90a without a word
        raise CompileError([Diagnostic("SP0601", "the target name is empty",
                                       help="e.g. target=\"sm_90a\", or leave it out (sm_90a)")])
    if isinstance(signature, str):
        signature = parse_signature(signature, kernel.globals)
    elif signature is not None and not isinstance(signature, dict):
        raise LaunchError("SP0724", f"the signature of `{kernel.name}` must be a dict or a text such as "
                          f"\"x=ptr[f32], n=i32\", found {type(signature).__name__}")
    if stop_after not in STAGES:
        raise LaunchError("SP0724", f"stop_after must be one of {', '.join(STAGES)}, found {stop_after!r}")
    bindings, sig_key = kernel.signature_bindings(signature or {})
    opts = {**KERNEL_OPTIONS, **kernel.options, **options}
    tgt = get_target(_first_given(target, opts.get("target"), "sm_90a"))
    if not cache or stop_after == "ir":
        return compile_function(kernel.fresh_ir(bindings, opts), tgt, num_warps=int(opts.get("num_warps") or 4),
                                stop_after=stop_after)
    check_options(options)
    key = ("aot", *sig_key, kernel._options_key(options))
    return compile_cached(kernel, bindings, key, tgt, opts, stop_after=stop_after, keep_llvm=True)


def _first_given(*values: Any) -> Any:
    """The first of ``values`` that is not None (``target=`` may be any object: an array given for it
    is SP0601 from ``get_target``, not numpy's "truth value of an array is ambiguous")."""
    return next(v for v in values if v is not None)
