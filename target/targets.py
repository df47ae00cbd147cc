"""The target table: every GPU architecture sparsile can emit code for, with its features.

A :class:`Target` says how to drive the toolchain (LLVM cpu name, PTX version feature string,
nvJitLink ``-arch=``) and what the hardware can do (a frozenset of :class:`Feature` plus the
:class:`SMResources` that legality checks against).

Feature availability follows ``docs/hardware.md`` §7 (tcgen05 table) and §0 items 4, 5, 9; the
rows for sm_8x / sm_90 / sm_12x and for the non-tcgen05 features (TMA, mbarrier, cluster, elect,
setmaxnreg, ``fence.proxy.async``, TMA ``.cta_group``) were probed here with ptxas 13.0: one
instruction per feature, assembled for every target in the table (``tests/backend/test_targets.py``
re-runs that probe whenever ptxas is installed). LLVM 22's instruction selector mirrors the same
table (§7 "LLVM's selector mirrors the table"), which is why :mod:`.llvm_to_ptx` gates intrinsics
with it before LLVM can abort the process (§0 item 2).

Codes: ``SP0601`` unknown target name, ``SP0602`` feature not available on the target.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass

from ..frontend.diagnostics import CompileError, Diagnostic, Severity
from ..frontend.spans import UNKNOWN_SPAN, Span

SP_UNKNOWN_TARGET = "SP0601"
SP_FEATURE_UNAVAILABLE = "SP0602"

KB = 1024


class Feature(enum.Enum):
    """A hardware capability that code generation may need. The value is the phrase used in
    diagnostics ("`tcgen05.mma` with kind::i8 is not available on sm_100f")."""

    MMA_SP = "`mma.sp::ordered_metadata` (sparse warp-level MMA)"
    CP_ASYNC = "`cp.async` (asynchronous global-to-shared copy)"
    WGMMA = "`wgmma.mma_async` (warpgroup MMA)"
    TMA = "TMA (`cp.async.bulk.tensor`)"
    TMA_CTA_GROUP = "TMA with `.cta_group::N`"
    MBARRIER = "`mbarrier` (init / arrive / test_wait)"
    MBARRIER_TX = "`mbarrier` transaction counts and `try_wait`"
    CLUSTER = "thread-block clusters"
    ELECT = "`elect.sync`"
    SETMAXNREG = "`setmaxnreg`"
    FENCE_PROXY_ASYNC = "`fence.proxy.async`"
    GRID_DEPENDENCY = "`griddepcontrol` (programmatic dependent launch)"
    TCGEN05 = "`tcgen05` (TMEM alloc/ld/st/cp/commit, mma kinds f16/tf32/f8f6f4)"
    TCGEN05_I8 = "`tcgen05.mma` with kind::i8"
    TCGEN05_MXF8F6F4 = "`tcgen05.mma` with kind::mxf8f6f4 (block-scaled)"
    TCGEN05_MXF4 = "sparse `tcgen05.mma` with kind::mxf4 / kind::mxf4nvf4"
    TCGEN05_SCALE_VEC = "`tcgen05.mma` with `.scale_vec::NX`"
    TCGEN05_SCALE_D = "`tcgen05.mma` with scale-input-d"
    TCGEN05_SHIFT = "`tcgen05.shift`"
    TCGEN05_LD_RED = "`tcgen05.ld.red`"
    FP8_CVT = "fp8 conversions (`cvt` with .e4m3x2 / .e5m2x2)"

    @property
    def description(self) -> str:
        return self.value


@dataclass(frozen=True)
class SMResources:
    """Per-block / per-SM limits that legality checks (CUDA programming guide, "Technical
    Specifications per Compute Capability"; TMEM geometry from ``docs/hardware.md`` §1.4)."""

    max_threads_per_block: int = 1024
    max_registers_per_thread: int = 255
    registers_per_sm: int = 65536
    max_smem_per_block_optin: int = 0
    """Largest dynamic shared memory a block may opt into (``cuFuncSetAttribute``), bytes."""
    smem_per_sm: int = 0
    tmem_columns: int = 0
    """TMEM columns per CTA (512 × 32-bit where tcgen05 exists, 0 elsewhere)."""
    tmem_lanes: int = 0
    max_cluster_size: int = 1
    """Portable cluster size (8 from sm_90 on; 1 = no clusters)."""


@dataclass(frozen=True)
class Target:
    """One compilation target, e.g. ``sm_100a``."""

    name: str
    major: int
    minor: int
    arch_specific: bool
    """``a`` suffix: arch-specific features, PTX not forward-compatible (§7)."""
    family: bool
    """``f`` suffix: family-specific, PTX runs on later members of the family (§7)."""
    ptx_version: tuple[int, int]
    llvm_cpu: str
    llvm_features: str
    """LLVM NVPTX feature string selecting the PTX ISA version, e.g. ``"+ptx88"``."""
    nvjitlink_arch: str
    """nvJitLink / ptxas option, e.g. ``"-arch=sm_100a"``."""
    features: frozenset[Feature]
    resources: SMResources

    @property
    def capability(self) -> tuple[int, int]:
        """Compute capability ``(major, minor)``."""
        return (self.major, self.minor)

    @property
    def sm(self) -> int:
        """The SM number, e.g. 100 for sm_100a."""
        return self.major * 10 + self.minor

    @property
    def arch_option(self) -> str:
        """The bare architecture, e.g. ``"sm_100a"`` (what ptxas' ``-arch`` takes)."""
        return self.nvjitlink_arch.removeprefix("-arch=")

    def has(self, feature: Feature) -> bool:
        return feature in self.features

    def __str__(self) -> str:
        return self.name


# --------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------

_SM80_FEATURES = frozenset({Feature.MMA_SP, Feature.CP_ASYNC, Feature.MBARRIER})
_SM90_FEATURES = _SM80_FEATURES | {
    Feature.TMA, Feature.MBARRIER_TX, Feature.CLUSTER, Feature.ELECT, Feature.FENCE_PROXY_ASYNC,
    Feature.GRID_DEPENDENCY,
}
_TCGEN05_COMMON = frozenset({Feature.TCGEN05, Feature.TCGEN05_MXF8F6F4, Feature.TMA_CTA_GROUP})

# §7 tcgen05 availability table, column by column (ptxas 13.0).
_TCGEN05_BY_VARIANT: dict[str, frozenset[Feature]] = {
    "sm_100a": _TCGEN05_COMMON | {
        Feature.TCGEN05_I8, Feature.TCGEN05_MXF4, Feature.TCGEN05_SCALE_VEC, Feature.TCGEN05_SCALE_D,
        Feature.TCGEN05_SHIFT,
    },
    "sm_100f": _TCGEN05_COMMON | {Feature.TCGEN05_SCALE_D},
    "sm_103a": _TCGEN05_COMMON | {
        Feature.TCGEN05_MXF4, Feature.TCGEN05_SCALE_VEC, Feature.TCGEN05_SCALE_D, Feature.TCGEN05_SHIFT,
        Feature.TCGEN05_LD_RED,
    },
    "sm_103f": _TCGEN05_COMMON | {Feature.TCGEN05_SCALE_D, Feature.TCGEN05_LD_RED},
    "sm_110a": _TCGEN05_COMMON | {
        Feature.TCGEN05_I8, Feature.TCGEN05_MXF4, Feature.TCGEN05_SCALE_VEC, Feature.TCGEN05_SHIFT,
        Feature.TCGEN05_LD_RED,
    },
    "sm_110f": _TCGEN05_COMMON | {Feature.TCGEN05_LD_RED},
}

_RES_SM80 = SMResources(max_smem_per_block_optin=163 * KB, smem_per_sm=164 * KB)
_RES_SM86 = SMResources(max_smem_per_block_optin=99 * KB, smem_per_sm=100 * KB)
_RES_SM90 = SMResources(max_smem_per_block_optin=227 * KB, smem_per_sm=228 * KB, max_cluster_size=8)
_RES_SM100 = SMResources(max_smem_per_block_optin=227 * KB, smem_per_sm=228 * KB, max_cluster_size=8,
                         tmem_columns=512, tmem_lanes=128)
_RES_SM120 = SMResources(max_smem_per_block_optin=99 * KB, smem_per_sm=100 * KB, max_cluster_size=8)

_NAME_RE = re.compile(r"^sm_(\d+)([af]?)$")


def _make(name: str, resources: SMResources) -> Target:
    match = _NAME_RE.match(name)
    assert match, name
    sm, suffix = int(match.group(1)), match.group(2)
    major, minor = divmod(sm, 10)
    # §7: `.target sm_110a` needs PTX 9.0 (LLVM aborts on sm_110* with +ptx88); everything else
    # here is emitted as PTX 8.8, which ptxas 13.0 and nvJitLink 13.x accept.
    ptx = (9, 0) if 110 <= sm < 120 else (8, 8)
    features = _SM80_FEATURES if major < 9 else _SM90_FEATURES
    if suffix and major >= 9:
        features = features | {Feature.SETMAXNREG}
    if name == "sm_90a":
        features = features | {Feature.WGMMA}
    if sm >= 89:  # PTX ISA, "cvt": .e4m3x2 / .e5m2x2 require sm_89 (docs/ampere.md)
        features = features | {Feature.FP8_CVT}
    features = features | _TCGEN05_BY_VARIANT.get(name, frozenset())
    if not features & {Feature.TCGEN05}:
        resources = dataclasses.replace(resources, tmem_columns=0, tmem_lanes=0)
    return Target(
        name=name, major=major, minor=minor, arch_specific=suffix == "a", family=suffix == "f",
        ptx_version=ptx, llvm_cpu=name, llvm_features=f"+ptx{ptx[0]}{ptx[1]}",
        nvjitlink_arch=f"-arch={name}", features=frozenset(features), resources=resources,
    )


def _build_table() -> dict[str, Target]:
    rows: list[tuple[str, SMResources]] = [
        ("sm_80", _RES_SM80), ("sm_86", _RES_SM86), ("sm_87", _RES_SM80), ("sm_89", _RES_SM86),
        ("sm_90", _RES_SM90), ("sm_90a", _RES_SM90),
    ]
    for family in ("100", "103", "110"):
        rows += [(f"sm_{family}{s}", _RES_SM100) for s in ("", "a", "f")]
    for family in ("120", "121"):
        rows += [(f"sm_{family}{s}", _RES_SM120) for s in ("", "a", "f")]
    return {name: _make(name, res) for name, res in rows}


TARGETS: dict[str, Target] = _build_table()
"""Every known target by name, in table order."""

DEFAULT_TARGET_NAME = "sm_90a"


def known_target_names() -> list[str]:
    return list(TARGETS)


def _normalize(name: str) -> str:
    text = name.strip().lower().replace("-", "_")
    for prefix in ("compute_", "sm"):
        if text.startswith(prefix):
            text = text[len(prefix):]
    text = text.lstrip("_")
    return f"sm_{text}"


_HOPPER = ("sm_90a", "Hopper: H100, H200, GH200")
_BLACKWELL = ("sm_100a", "Blackwell: B200, GB200; B300 is sm_103a, RTX 50 series sm_120a")
_AMPERE = ("sm_80", "Ampere: A100, A800; A10, A40 and RTX 30 series are sm_86")
GPU_NAMES: dict[str, tuple[str, str]] = {
    "hopper": _HOPPER, "h100": _HOPPER, "h200": _HOPPER, "h800": _HOPPER, "h20": _HOPPER, "gh200": _HOPPER,
    "blackwell": _BLACKWELL, "b200": _BLACKWELL, "b100": _BLACKWELL, "gb200": _BLACKWELL,
    "ampere": _AMPERE, "a100": _AMPERE, "a800": _AMPERE, "a30": _AMPERE,
}
"""Architecture and data-center GPU names (lower case, no spaces) -> (the target to write, what it
covers): ``target="hopper"`` is SP0601 whose help says ``did you mean `sm_90a`?`` (by spelling alone
``h100`` came close to ``sm_100``, a Blackwell target)."""


def target_suggestion(name: object, among: Iterable[str] | None = None) -> str:
    """The start of the help line for an unknown target ``name``: ``did you mean `sm_90a`? (Hopper:
    H100, H200, GH200) `` for a GPU or architecture name of :data:`GPU_NAMES`, else ``did you mean
    `sm_100a`? `` for the closest spelling, else "". ``among``: the targets an entry point accepts
    (default every target); a GPU name whose target is not among them gets no suggestion (by
    spelling alone ``A100`` came close to ``sm_100a``). Every diagnostic for an unknown target
    (SP0601 here, ``warm_up``'s SP0923, ``sparse_matmul``'s SP0804) starts its help with this."""
    if not isinstance(name, str):
        return ""
    names = list(TARGETS) if among is None else list(among)
    plain = re.sub(r"[\s_-]", "", name.lower()).removeprefix("nvidia")
    if plain in GPU_NAMES:
        target, covers = GPU_NAMES[plain]
        return f"did you mean `{target}`? ({covers}) " if target in names else ""
    # compared without the `sm_` every key shares (with it, `foo` came close to `sm_121f`)
    close = difflib.get_close_matches(_normalize(name).removeprefix("sm_"), [t.removeprefix("sm_") for t in names],
                                      n=1, cutoff=0.6)
    return f"did you mean `sm_{close[0]}`? " if close else ""


def get_target(name: str | Target, span: Span = UNKNOWN_SPAN) -> Target:
    """The target called ``name`` (``"sm_100a"``; ``"SM100A"`` and ``"100a"`` also work).

    Raises :class:`CompileError` ``SP0601`` naming the closest known target otherwise.
    """
    if isinstance(name, Target):
        return name
    if not isinstance(name, str):
        raise CompileError([Diagnostic(SP_UNKNOWN_TARGET, f"a target name must be a string, got {name!r}",
                                       span, help=f"use one of: {', '.join(TARGETS)}")])
    key = _normalize(name)
    if key in TARGETS:
        return TARGETS[key]
    help_line = f"{target_suggestion(name)}known targets: {', '.join(TARGETS)}"
    notes: tuple[str, ...] = ()
    if key in ("sm_101a", "sm_101f", "sm_101"):
        notes = ("sm_101a was renamed sm_110a (docs/hardware.md §7)",)
    raise CompileError([Diagnostic(SP_UNKNOWN_TARGET, f"unknown target `{name}`", span, help=help_line,
                                   notes=notes)])


def default_target() -> Target:
    """The target used when nothing else says (sm_90a, the H200); the runtime overrides it from
    the device with :func:`target_for_capability`."""
    return TARGETS[DEFAULT_TARGET_NAME]


def target_for_capability(major: int, minor: int) -> Target:
    """The most capable target for a device of compute capability ``major.minor``: the
    arch-specific ``a`` variant where one exists (sm_90 -> sm_90a, sm_100 -> sm_100a), else
    the plain target. Raises ``SP0601`` for devices that are not in the table."""
    base = f"sm_{major}{minor}"
    for name in (base + "a", base):
        if name in TARGETS:
            return TARGETS[name]
    raise CompileError([Diagnostic(
        SP_UNKNOWN_TARGET, f"no sparsile target for compute capability {major}.{minor}",
        help=f"sparsile supports compute capability 8.0 and newer: {', '.join(TARGETS)}")])


def targets_with(feature: Feature) -> list[Target]:
    """Every target that has ``feature``, in table order."""
    return [t for t in TARGETS.values() if feature in t.features]


def _suffix_note(target: Target, having: list[Target]) -> str | None:
    """Explain the a/f/plain distinction when a sibling of ``target`` has the feature."""
    siblings = [t.name for t in having if t.sm == target.sm and t.name != target.name]
    if not siblings:
        return None
    return (f"{target.name} and {', '.join(siblings)} are the same GPU; the feature is only "
            "reachable through the listed target (docs/hardware.md §7: `a` targets get every "
            "feature of the chip, `f` targets a family-portable subset)")


def feature_problem(target: Target, feature: Feature, span: Span = UNKNOWN_SPAN,
                    what: str | None = None, code: str = SP_FEATURE_UNAVAILABLE) -> Diagnostic | None:
    """``None`` when ``target`` has ``feature``; otherwise the diagnostic saying so, e.g.
    ``error[SP0602]: `tcgen05.mma` with kind::i8 is not available on sm_100f`` with a help line
    naming the targets that have it."""
    if feature in target.features:
        return None
    having = targets_with(feature)
    subject = what or feature.description
    if having:
        help_line = f"targets that have it: {', '.join(t.name for t in having)}"
    else:
        help_line = "no known target has it"
    note = _suffix_note(target, having)
    return Diagnostic(code, f"{subject} is not available on {target.name}", span, Severity.ERROR,
                      help=help_line, notes=(note,) if note else ())


def require(target: Target, feature: Feature, span: Span = UNKNOWN_SPAN, what: str | None = None) -> None:
    """Raise :class:`CompileError` ``SP0602`` unless ``target`` has ``feature``.

    Code generation calls this before emitting inline asm (which LLVM does not check and
    ptxas/nvJitLink would reject) and before any intrinsic whose selection could abort LLVM.
    """
    diag = feature_problem(target, feature, span, what)
    if diag is not None:
        raise CompileError([diag])
