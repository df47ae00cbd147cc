"""LLVM IR (text) -> PTX with llvmlite's NVPTX backend, gated by the target table.

LLVM 22 aborts the whole Python process ("LLVM ERROR: Cannot select: intrinsic ...") on an
NVVM intrinsic the selected SM cannot execute (``docs/hardware.md`` §0 item 2, §7 "LLVM's
selector mirrors the table"). So before LLVM sees a module, every ``llvm.nvvm.*`` intrinsic it
declares is mapped to the :class:`~.targets.Feature` it needs (:func:`intrinsic_features`)
and checked against the target; a missing feature becomes diagnostic ``SP0603`` instead of a
dead interpreter. Some requirements depend on immediate arguments (``kind`` of
``tcgen05.mma``: kind::i8 needs ``TCGEN05_I8``; the ``cta_group`` flag of TMA loads), so the
gate reads those from the call sites, and code generation can ask the same question up front
with :func:`check_intrinsic`.

Inline asm is invisible to this gate (LLVM passes it through and ptxas/nvJitLink reject it):
code generation gates it with :func:`.targets.require`.

Bad IR (parse or verifier failure, unknown intrinsic) is a compiler bug: :class:`InternalError`.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import llvmlite.binding as llvm

from ...frontend.diagnostics import CompileError, Diagnostic, InternalError
from ...frontend.spans import UNKNOWN_SPAN, Span
from ...target.targets import Feature, Target, feature_problem

SP_INTRINSIC_UNAVAILABLE = "SP0603"
NVPTX_TRIPLE = "nvptx64-nvidia-cuda"
_NVVM = "llvm.nvvm."
_LLVM_LOCK = threading.Lock()

# tcgen05.mma ``kind`` immarg values (docs/hardware.md §6 "Flag encodings").
TCGEN05_MMA_KIND_CODES = {"f16": 0, "tf32": 1, "f8f6f4": 2, "i8": 3}


@functools.cache
def _initialize_llvm() -> None:
    """Register the NVPTX target once (llvmlite 0.50: no ``llvm.initialize()``)."""
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()


@functools.cache
def _target_machine(cpu: str, features: str, opt_level: int) -> llvm.TargetMachine:
    _initialize_llvm()
    nvptx = llvm.Target.from_triple(NVPTX_TRIPLE)
    return nvptx.create_target_machine(cpu=cpu, features=features, opt=opt_level)


# --------------------------------------------------------------------------------------------
# Intrinsic -> feature mapping
# --------------------------------------------------------------------------------------------

# (prefix after "llvm.nvvm.", feature); the first matching prefix wins. Names not listed need
# nothing beyond sm_80 (thread ids, barriers, shuffles, math, ...).
_PREFIX_FEATURES: tuple[tuple[str, Feature], ...] = (
    ("tcgen05.", Feature.TCGEN05),
    ("wgmma.", Feature.WGMMA),
    ("mma.sp.", Feature.MMA_SP),
    ("cp.async.bulk.", Feature.TMA),
    ("cp.async.", Feature.CP_ASYNC),
    ("prefetch.tensormap", Feature.TMA),
    ("fence.proxy.tensormap", Feature.TMA),
    ("fence.proxy.async", Feature.FENCE_PROXY_ASYNC),
    ("fence.mbarrier_init", Feature.CLUSTER),
    ("barrier.cluster.", Feature.CLUSTER),
    ("read.ptx.sreg.cluster", Feature.CLUSTER),
    ("read.ptx.sreg.nclusterid", Feature.CLUSTER),
    ("read.ptx.sreg.is.explicit.cluster", Feature.CLUSTER),
    ("mapa", Feature.CLUSTER),
    ("elect.sync", Feature.ELECT),
    ("setmaxnreg.", Feature.SETMAXNREG),
    ("mbarrier.", Feature.MBARRIER),
)
# mbarrier forms that need sm_90 (transaction counts, try_wait, scoped arrive/expect_tx).
_MBARRIER_SM90_MARKERS = ("tx", "try.wait", ".scope.")


def _tcgen05_mma_kind(name: str, immargs: Sequence[int]) -> int | None:
    """The ``kind`` immarg of a plain-kind ``tcgen05.mma*`` intrinsic: its first immediate
    argument, except for ``.scale_d`` forms whose first immediate is the scale (§6)."""
    index = 1 if ".scale_d" in name else 0
    return immargs[index] if len(immargs) > index else None


def intrinsic_features(name: str, immargs: Sequence[int] = ()) -> frozenset[Feature]:
    """The features an ``llvm.nvvm.*`` intrinsic needs, given its immediate arguments in
    operand order (``immargs``). Non-NVVM names need nothing."""
    if not name.startswith(_NVVM):
        return frozenset()
    short = name[len(_NVVM):]
    base = next((f for prefix, f in _PREFIX_FEATURES if short.startswith(prefix)), None)
    if base is None:
        return frozenset()
    needs = {base}
    if base is Feature.MBARRIER and any(marker in short for marker in _MBARRIER_SM90_MARKERS):
        needs = {Feature.MBARRIER_TX}
    elif base is Feature.TMA and short.startswith("cp.async.bulk.tensor.g2s.") and ".g2s.cta." not in short:
        if immargs and immargs[-1] != 0:  # trailing cta_group flag (§6 TMA row)
            needs.add(Feature.TMA_CTA_GROUP)
    elif base is Feature.TCGEN05:
        needs |= _tcgen05_features(short, immargs)
    return frozenset(needs)


def _tcgen05_features(short: str, immargs: Sequence[int]) -> set[Feature]:
    """Sub-features of tcgen05 intrinsics, per the §7 availability table."""
    needs: set[Feature] = set()
    if short.startswith("tcgen05.shift"):
        needs.add(Feature.TCGEN05_SHIFT)
    if short.startswith("tcgen05.ld.red"):
        needs.add(Feature.TCGEN05_LD_RED)
    if not short.startswith("tcgen05.mma"):
        return needs
    if "scale_vec" in short:
        needs.add(Feature.TCGEN05_SCALE_VEC)
    if "mxf8f6f4" in short:
        needs.add(Feature.TCGEN05_MXF8F6F4)
    elif "mxf4" in short:  # mxf4 and mxf4nvf4: sparse forms are `a`-only, dense ones are not
        needs.add(Feature.TCGEN05_MXF4 if short.startswith("tcgen05.mma.sp.") else Feature.TCGEN05_MXF8F6F4)
    else:
        if ".scale_d" in short:
            needs.add(Feature.TCGEN05_SCALE_D)
        if _tcgen05_mma_kind(short, immargs) == TCGEN05_MMA_KIND_CODES["i8"]:
            needs.add(Feature.TCGEN05_I8)
    return needs


# Report the base feature first: "tcgen05 is not available on sm_90a" says more than "kind::i8".
_FEATURE_ORDER = {f: i for i, f in enumerate(Feature)}


def intrinsic_problem(target: Target, name: str, immargs: Sequence[int] = (),
                      span: Span = UNKNOWN_SPAN) -> Diagnostic | None:
    """``None`` if ``target`` can run the intrinsic, else the ``SP0603`` diagnostic."""
    for feature in sorted(intrinsic_features(name, immargs), key=_FEATURE_ORDER.__getitem__):
        diag = feature_problem(target, feature, span, what=f"{feature.description} (LLVM intrinsic `{name}`)",
                               code=SP_INTRINSIC_UNAVAILABLE)
        if diag is not None:
            note = ("LLVM's NVPTX backend would abort the process on this intrinsic "
                    "(docs/hardware.md §0 item 2), so sparsile refuses it first")
            return Diagnostic(diag.code, diag.message, diag.span, diag.severity, diag.help, diag.labels,
                              (*diag.notes, note))
    return None


def check_intrinsic(target: Target, name: str, immargs: Sequence[int] = (),
                    span: Span = UNKNOWN_SPAN) -> None:
    """Raise :class:`CompileError` ``SP0603`` unless ``target`` has every feature the intrinsic
    ``name`` needs with immediate arguments ``immargs`` (in operand order; e.g. for
    ``llvm.nvvm.tcgen05.mma.sp.shared`` pass ``(kind, cta_group, collector)``)."""
    diag = intrinsic_problem(target, name, immargs, span)
    if diag is not None:
        raise CompileError([diag])


# --------------------------------------------------------------------------------------------
# Module inspection
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IntrinsicCall:
    """One distinct use of an ``llvm.nvvm.*`` intrinsic: its name and immediate arguments."""

    name: str
    immargs: tuple[int, ...] = ()


def _needs_immargs(name: str) -> bool:
    short = name[len(_NVVM):]
    return short.startswith("tcgen05.mma") or short.startswith("cp.async.bulk.tensor.g2s.")


def _immarg_positions(fn: llvm.ValueRef) -> list[int]:
    return [i for i, arg in enumerate(fn.arguments) if b"immarg" in set(arg.attributes)]


_I1 = {"true": 1, "false": 0}
# What may stand before the callee of a call site on its line: a result, a tail marker, ``call``,
# then flags, calling convention, return attributes and type (no global, comment or string).
_CALL_PREFIX = re.compile(r'\s*(?:%[-\w$.]+\s*=\s*)?(?:(?:tail|musttail|notail)\s+)?call\b[^;@"]*')
_DECLARE_PREFIX = re.compile(r"\s*declare\b[^;@\"]*")
_QUOTED_GLOBAL = re.compile(r'@"((?:[^"\\]|\\.)*)"')
_OPEN, _CLOSE = "([{<", ")]}>"


def _call_arguments(text: str, start: int) -> list[str] | None:
    """The top-level arguments of the call whose ``(`` is at ``start`` (commas inside ``()``,
    ``[]``, ``{}``, ``<>`` and strings do not separate them), or None where it does not close."""
    args, depth, cur, quoted = [], 0, [], False
    for i in range(start + 1, len(text)):
        ch = text[i]
        if quoted:
            quoted = ch != '"'
        elif ch == '"':
            quoted = True
        elif ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            if depth == 0:
                if ch != ")":
                    return None
                args.append("".join(cur))
                return args
            depth -= 1
        elif ch == "," and depth == 0:
            args.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    return None


def _immargs_in_text(text: str, by_immargs: dict[str, list[int]],
                     arity: dict[str, int] | None = None) -> dict[tuple[str, tuple[int, ...]], None] | None:
    """The (intrinsic, immediates) of every call site of the ``by_immargs`` intrinsics in the IR
    ``text`` the module was parsed from, read from the text (immediate arguments are literal
    constants there: ``i1 false``, ``i32 0``); None where any mention of one of them does not read
    as its declaration or as a one-line ``call ... @name(args)`` with ``arity[name]`` arguments
    (a quoted callee, a comment, a callee on the line after ``call``: the caller then walks the
    module's instructions). A call site missed here would reach LLVM ungated."""
    for match in _QUOTED_GLOBAL.finditer(text):  # @"llvm\2Envvm...": left to the walk
        name = re.sub(r"\\([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), match.group(1))
        if name in by_immargs:
            return None
    found: dict[tuple[str, tuple[int, ...]], None] = {}
    for name, positions in by_immargs.items():
        for match in re.finditer(rf"@{re.escape(name)}(?![-\w$.])", text):
            line = text[text.rfind("\n", 0, match.start()) + 1:match.start()]
            if _DECLARE_PREFIX.fullmatch(line):
                continue
            paren = re.compile(r"\s*\(").match(text, match.end())
            if not _CALL_PREFIX.fullmatch(line) or paren is None:
                return None
            args = _call_arguments(text, paren.end() - 1)
            if args is None or (arity is not None and len(args) != arity.get(name)):
                return None
            try:
                tokens = [args[i].split()[-1] for i in positions]
                values = tuple(_I1[t] if t in _I1 else int(t) for t in tokens)
            except (IndexError, ValueError):
                return None
            found[(name, values)] = None
    return found


def nvvm_intrinsic_calls(module: llvm.ModuleRef, text: str | None = None) -> list[IntrinsicCall]:
    """Every distinct ``llvm.nvvm.*`` intrinsic declared by ``module``. For those whose needs
    depend on immediates, one entry per distinct immediate tuple found at call sites: read from
    ``text``, the IR the module was parsed from, where given (walking every instruction through
    llvmlite took a tenth of a large kernel's compile), else from the module's instructions.
    Raises :class:`InternalError` for an ``llvm.nvvm.*`` name LLVM does not know (it would be
    emitted as a call to an undefined function)."""
    found: dict[tuple[str, tuple[int, ...]], None] = {}
    by_immargs: dict[str, list[int]] = {}
    arity: dict[str, int] = {}
    for fn in module.functions:
        if not fn.is_declaration or not fn.name.startswith(_NVVM):
            continue
        if "Unknown intrinsic" in str(fn):
            raise InternalError(f"the generated LLVM IR calls `{fn.name}`, which LLVM 22 does not know")
        if _needs_immargs(fn.name):
            by_immargs[fn.name] = _immarg_positions(fn)
            arity[fn.name] = len(list(fn.arguments))
        else:
            found[(fn.name, ())] = None
    from_text = _immargs_in_text(text, by_immargs, arity) if by_immargs and text is not None else None
    if from_text is not None:
        found.update(from_text)
    elif by_immargs:
        for fn in module.functions:
            if fn.is_declaration:
                continue
            for block in fn.blocks:
                for inst in block.instructions:
                    if inst.opcode != "call":
                        continue
                    operands = list(inst.operands)
                    callee = operands[-1].name
                    if callee in by_immargs:
                        values = tuple(int(operands[i].get_constant_value()) for i in by_immargs[callee])
                        found[(callee, values)] = None
    return [IntrinsicCall(name, imm) for name, imm in found]


def gate_module(module: llvm.ModuleRef, target: Target, text: str | None = None) -> None:
    """Raise one :class:`CompileError` listing every intrinsic of ``module`` that ``target``
    cannot run (``SP0603``); ``text``: the IR ``module`` was parsed from (:func:`nvvm_intrinsic_calls`)."""
    diags: list[Diagnostic] = []
    seen: set[str] = set()
    for call in nvvm_intrinsic_calls(module, text):
        diag = intrinsic_problem(target, call.name, call.immargs)
        if diag is not None and diag.message not in seen:
            seen.add(diag.message)
            diags.append(diag)
    if diags:
        raise CompileError(diags)


# --------------------------------------------------------------------------------------------
# Compilation
# --------------------------------------------------------------------------------------------


def _excerpt(llvm_ir: str, message: str) -> str:
    """Append the offending IR line when LLVM's message names one (``<string>:LINE:COL``)."""
    match = re.search(r"<string>:(\d+):\d+", message)
    if not match:
        return message
    lines = llvm_ir.splitlines()
    lineno = int(match.group(1))
    if 1 <= lineno <= len(lines):
        return f"{message}\n  line {lineno}: {lines[lineno - 1].strip()}"
    return message


def parse_module(llvm_ir: str) -> llvm.ModuleRef:
    """Parse and verify ``llvm_ir``; failures are :class:`InternalError` (the compiler made bad IR)."""
    _initialize_llvm()
    try:
        module = llvm.parse_assembly(llvm_ir)
    except RuntimeError as exc:
        raise InternalError(f"LLVM could not parse the generated IR: {_excerpt(llvm_ir, str(exc))}") from None
    try:
        module.verify()
    except RuntimeError as exc:
        raise InternalError(f"the generated LLVM IR does not verify: {exc}") from None
    return module


def llvm_ir_to_ptx(llvm_ir: str, target: Target, opt_level: int = 3) -> str:
    """Compile LLVM IR text to PTX text for ``target``.

    Steps: parse + verify (:class:`InternalError` on failure), gate intrinsics against the
    target table (:class:`CompileError` ``SP0603``), set triple/data layout if missing, run the
    ``O<opt_level>`` pipeline, then NVPTX code generation with ``target.llvm_cpu`` and
    ``target.llvm_features`` (the PTX ISA version).
    """
    if opt_level not in (0, 1, 2, 3):
        raise InternalError(f"opt_level must be 0..3, got {opt_level!r}")
    with _LLVM_LOCK:
        module = parse_module(llvm_ir)
        gate_module(module, target, llvm_ir)
        tm = _target_machine(target.llvm_cpu, target.llvm_features, opt_level)
        if not module.triple:
            module.triple = NVPTX_TRIPLE
        elif not module.triple.startswith("nvptx"):
            raise InternalError(f"LLVM module has triple {module.triple!r}, expected {NVPTX_TRIPLE!r}")
        if not module.data_layout:
            module.data_layout = str(tm.target_data)
        if opt_level > 0:
            tuning = llvm.create_pipeline_tuning_options(speed_level=opt_level)
            # No loop vectorizer: NVPTX has no vector registers for it to use (our kernels' vector
            # loads and stores are explicit), it changed none of the shipped kernels' PTX, and
            # its cost-model assertion aborts the process on some valid loops (LLVM 22 as built
            # for llvmlite 0.50 keeps assertions; tests/frontend/test_program_fuzz.py, seed 93098).
            tuning.loop_vectorization = False
            builder = llvm.create_pass_builder(tm, tuning)
            builder.getModulePassManager().run(module, builder)
        try:
            return tm.emit_assembly(module)
        except RuntimeError as exc:
            raise InternalError(f"NVPTX code generation failed for {target.name}: {exc}") from None
