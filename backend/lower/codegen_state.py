"""What the lowerings of one kernel leave for each other while it is generated: ``CodeGen.state``.

One :class:`CodegenState` per :class:`~.codegen.CodeGen` (one kernel), written by
``CodeGen.generate`` before the body is lowered and by the lowerings as they go. What the target's
prepare hook handed on before layout inference is ``CodeGen.prepared``
(:class:`~sparsile.target.hooks.PreparedState`), not here. Values that matter only inside one
op's lowering stay local to it. See docs/architecture.md, "The pipeline".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .llvm_text import LLValue

if TYPE_CHECKING:  # annotation only: the analysis is built on first use by backend/lower/memory.py
    from ...frontend.ir.axis_info import AxisAnalysis

TmaKey = tuple[tuple[int, ...], int]
"""One tensor map of a tensor parameter: (box shape in numpy order, swizzle bytes)
(``tma.tma_key``)."""


@dataclass
class CodegenState:
    """The per-kernel state of code generation: one typed field per value a lowering leaves for others."""

    cluster: tuple[int, ...] | None = None
    """The thread-block cluster shape of a cluster kernel (the function's ``cluster`` attribute),
    None otherwise. Written by ``CodeGen.generate``; read by the mbarrier lowerings
    (``asynchronous.py``: multicast arrivals, the wait's scope) and ``compile_function``, which puts
    it in the compiled kernel's launch metadata."""

    default_regs: int = 0
    """The registers per thread each warp gets without ``setmaxnreg``: 64 Ki registers over the
    CTA's threads, rounded down to a multiple of 8, at most 255. Written by ``CodeGen.generate``;
    read by the ``warp_specialize`` lowering (``asynchronous.py``), which emits ``setmaxnreg.inc``
    for a partition's larger budget and ``.dec`` otherwise."""

    tma_keys: dict[int, list[TmaKey]] = field(default_factory=dict)
    """``id(tensor parameter value) ->`` the distinct tensor maps the kernel's TMA ops use on it,
    in first-use order. Written by ``tma.collect_tma_keys`` before the parameters are
    declared; read by ``CodeGen.tensormap_keys`` (one ``tensormap`` kernel parameter each)."""

    smem_addr: LLValue | None = None
    """The 32-bit shared-memory address of the kernel's dynamic shared memory, emitted once in the
    function's entry block on first use. Written and read by ``asynchronous.smem_base_address``."""

    axis: AxisAnalysis | None = None
    """The contiguity/divisibility analysis of the kernel's pointers, run on first use. Written
    and read by ``memory.py`` (vectorized loads and stores)."""

    tmem_base: LLValue | None = None
    """The tensor-memory address of the kernel-wide allocation (None until ``tmem.init`` is
    lowered). Written by the ``tmem.init`` lowering (``blackwell.py``); read by ``tmem.alloc``,
    ``tmem.release`` and the tile MMA lowering (``blackwell_tile.py``)."""

    issuers: dict[int, LLValue] = field(default_factory=dict)
    """``id(partition entry block) ->`` the i1 that is true in the one thread of that partition
    that issues tcgen05 operations, emitted once per partition. Written and read by
    ``blackwell._issuer``."""

    live_a: list[LLValue] = field(default_factory=list)
    """The packed A registers of register-A wgmmas committed and not yet retired by a
    ``wgmma.wait_group 0``. Appended to by the wgmma lowering (``hopper.py``); taken and cleared
    by ``hopper.keep_a_live`` at that wait."""
