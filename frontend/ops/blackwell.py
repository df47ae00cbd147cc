"""The Blackwell explicit level: tensor memory (namespace ``tmem``) and the fifth-generation tensor
core (namespace ``tcgen05``) of sm_100a / sm_103a / sm_110a (PTX ISA 9.7.16; docs/hardware.md
§1-2, §6-7).

Semantics (``frontend/interp/blackwell.py`` implements them; the backend is
``backend/lower/blackwell.py``, ``tcgen05`` in ``backend/lower/blackwell_mma.py``):

* ``tmem.alloc(dtype, shape, kind="acc", meta_dtype=None)`` — a region of tensor memory. ``shape``
  is ``(rows, cols)`` or ``(stages, rows, cols)``; rows are 128 (one TMEM lane per row) or 256 (two
  128-row tiles side by side in columns, for a 1-CTA M=256 MMA). ``kind``: ``"acc"`` (an MMA
  accumulator: f32, f16 or i32, one 32-bit column per element), ``"a"`` (an A operand, packed:
  two 16-bit / four 8-bit values per column), ``"meta"`` (sparse metadata words, u32, for A
  operands of type ``meta_dtype``; columns in multiples of 4 = one 2 KB ``tcgen05.cp`` atom).
  ``"scale"`` (UE8M0 block scale factors of a block-scaled MMA, u32 words of 4 bytes, columns in
  multiples of 4 = one ``tcgen05.cp.32x128b.warpx4`` atom; ``frontend/ops/tmem_scales.py``).
  Every allocation of a kernel is placed, in program order, inside ONE power-of-two allocation
  of at most 512 columns (SP0540 past that); allocations must be at the kernel's top level.
  Contents are undefined until written (NaN / a poison pattern in the interpreter).
* ``ref[i]`` picks one stage; ``ref.slice(dim, start, size)`` a row tile (dim 0: 128 rows at a
  constant multiple of 128) or columns (dim 1, of a 128-row view).
* ``ref.load()`` / ``ref.store(tile)`` — ``tcgen05.ld`` / ``tcgen05.st`` by every thread of the
  current partition (whole warpgroups), through the access atom the layout algebra derives; a
  metadata ref loads its words (the "sm90" word matrix of docs/sparse-metadata.md: a TMEM cell of
  a 128-row tile is exactly that word), ``meta.load_chunks()`` the logical 4-bit codes
  (``(rows, 8·cols)`` u8, chunk ``j`` of row ``m`` at ``[m, j]``), which needs the true TMEM
  image of the metadata (rows m and m+8 share a cell for 16-bit operands; seed 000).
* ``tcgen05.mma(a, b, acc, a_meta=None, accumulate=True, a_scale=None, b_scale=None)`` — ``acc =
  A @ B^T (+ acc)`` issued by
  one elected thread; A is a shared-memory buffer (M x K, or M x K/2 compressed values when
  ``a_meta`` is given) or a TMEM ``"a"`` ref, B a shared-memory buffer N x K (K-major); ``acc``
  an M x N accumulator ref. One call may span several instruction tiles (M = 256 as two M = 128
  tiles, N > 256 as N chunks); the compiler splits it and addresses the metadata per M tile and K
  step (docs/hardware.md §11; seed 001). Asynchronous: completion is observed with
  ``tcgen05.commit(bar)`` (one mbarrier arrival once every earlier tcgen05 operation of the
  issuing thread is done). With ``a_scale`` / ``b_scale`` (``kind="scale"`` refs) the MMA is
  block-scaled (kind::mxf8f6f4 ``.block_scale``, e4m3/e5m2 operands, f32 accumulator):
  ``acc = (A · SA) @ (B · SB)^T (+ acc)`` with one UE8M0 scale per row and instruction K (32 dense,
  64 logical K sparse); see ``tmem_scales.py`` for where the scales live.
* ``tcgen05.copy(src, dst)`` — ``tcgen05.cp.128x128b``: 2 KB metadata atoms ``(128, 4)`` u32 (or a
  stack ``(n, 128, 4)``) from shared memory into the columns of a metadata ref; into a scale ref,
  ``tcgen05.cp.32x128b.warpx4``: 512-byte scale atoms ``(32, 4)`` u32 (or ``(32n, 4)`` /
  ``(n, 32, 4)``), each duplicated into the four lane quarters of 4 columns.
* ``tcgen05.fence_before()`` / ``tcgen05.fence_after()`` — ``tcgen05.fence::before_thread_sync``
  (before signalling other threads about TMEM) and ``::after_thread_sync`` (after such a wait,
  before ``tcgen05.ld`` / ``mma``).

The interpreter semantics live in ``frontend/interp/blackwell.py``: an MMA (and a copy) runs when
it is issued, a valid order of the asynchronous hardware, since its completion is only observable
through ``commit`` + ``mbarrier.wait``; an access the GPU would not order after that completion is
reported (SP0791, ``frontend/interp/tcgen05_async.py``).

This module defines the ops; the builtins that type them are ``tmem.py`` (namespace ``tmem`` and the
methods of TMEM references) and ``tcgen05.py`` (namespace ``tcgen05``), and the operand classes and
TMEM geometry that they, the interpreter and the backend share are ``blackwell_operands.py``.
"""

from __future__ import annotations

from ..ir.core import Operation
from .opdefs import NO_LAYOUT_RULE, TYPED_BY_SEMA, define_op, flagged, none


def mma_operands(op: Operation) -> tuple[str, ...]:
    """``a, b, d`` (the TMEM accumulator), ``a_meta`` when sparse, ``a_scale, b_scale`` when
    block-scaled, and last ``enable`` (accumulate into d, or overwrite it)."""
    names = ("a", "b", "d") + (("a_meta",) if op.attrs.get("sparse") else ())
    return names + (("a_scale", "b_scale") if op.attrs.get("block_scale") else ()) + ("enable",)


tmem_alloc_op = define_op("tmem.alloc", verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE, side_effects=True,
                          doc="A region of tensor memory (placed at compile time).")
tmem_index_op = define_op("tmem.index", operands=("ref", "index"), verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE,
                          doc="One stage of a stacked TMEM region.")
tmem_slice_op = define_op("tmem.slice", operands=("ref", "start"), verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE,
                          doc="A row tile or a column range of a TMEM region.")
tmem_load_op = define_op("tmem.load", operands=("ref",), verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE,
                         doc="tcgen05.ld: a TMEM region into registers.")
tmem_load_chunks_op = define_op("tmem.load_chunks", operands=("ref",), verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE,
                                doc="tcgen05.ld of metadata as logical 4-bit codes.")
tmem_store_op = define_op("tmem.store", operands=("ref", "value"), verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE,
                          side_effects=True, doc="tcgen05.st: registers into a TMEM region.")
tmem_init_op = define_op("tmem.init", verify=none("added by the backend, without operands or results"),
                         layout=NO_LAYOUT_RULE, side_effects=True,
                         doc="Kernel start: allocate all TMEM (added by the backend).")
tmem_release_op = define_op("tmem.release", verify=none("added by the backend, without operands or results"),
                            layout=NO_LAYOUT_RULE, side_effects=True,
                            doc="Kernel end: free all TMEM (added by the backend).")
mma_op = define_op("tcgen05.mma", operands=mma_operands, verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE,
                   side_effects=True, doc="Asynchronous tcgen05.mma[.sp] issued by one thread.")
copy_op = define_op("tcgen05.copy", operands=("src", "dst"), verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE,
                    side_effects=True, doc="tcgen05.cp.128x128b: metadata atoms SMEM -> TMEM.")
commit_op = define_op("tcgen05.commit", operands=flagged(("bar",), ("mask", "multicast")), verify=TYPED_BY_SEMA,
                      layout=NO_LAYOUT_RULE, side_effects=True,
                      doc="tcgen05.commit: arrive on an mbarrier when done.")
fence_before_op = define_op("tcgen05.fence_before", verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE, side_effects=True,
                            doc="tcgen05.fence::before_thread_sync")
fence_after_op = define_op("tcgen05.fence_after", verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE, side_effects=True,
                           doc="tcgen05.fence::after_thread_sync")
