"""Vectorized shared-memory stores and loads of register tiles (``smem.store``, ``smem.load``).

A thread's registers often hold runs of consecutive elements of a row: the wgmma accumulator layout
gives each thread column pairs (docs/hardware.md §4.2), a blocked layout runs of ``vec``. Such a run
is stored as one word or vector (``st.shared.b32``, ``.v2``, ``.v4``) instead of one store per
element, when (a) consecutive registers walk the last dimension, (b) every other basis of the
layout (the other registers, lanes, warps) moves the last coordinate by a multiple of the run, so
that each run starts at a multiple of its length, and (c) the run stays inside one 16-byte chunk of
a row: a swizzled buffer permutes whole 16-byte chunks (docs/hardware.md §5.3),
and an unswizzled one keeps rows of a multiple of the run's bytes. Loads take the same runs
(``ld.shared.v4.b32`` for eight 16-bit elements), under the same conditions.
"""

from __future__ import annotations

from typing import Any

from ...frontend.layout.layouts import LinearLayout
from ...frontend.layout.tile import REG, register_coords, thread_bases
from .codegen import CodeGen, DTile
from .llvm_text import LLValue
from .memory import pack_words, run_words, unpack_words


def smem_run_width(layout: LinearLayout, elem_bytes: int, panel_cols: int, row_bytes: int) -> int:
    """Elements per access (a power of two, 16 bytes at most) for a tile of ``layout`` written into
    or read from a buffer whose column panels hold ``panel_cols`` elements and whose rows are
    ``row_bytes`` long."""
    offs = register_coords(layout)
    if not offs or elem_bytes not in (1, 2, 4, 8):
        return 1
    rank = len(offs[0])
    last = rank - 1
    v = 1
    while 2 * v <= min(len(offs), 16 // elem_bytes) and all(
            offs[i] == tuple(i if d == last else 0 for d in range(rank)) for i in range(2 * v)):
        v *= 2
    while v > 1:
        low = v.bit_length() - 1  # the register bases that walk inside a run
        others = [b for name in layout.in_names for k, b in enumerate(thread_bases(layout, name))
                  if not (name == REG and k < low)]
        if all(b[last] % v == 0 for b in others) and panel_cols % v == 0 and row_bytes % (v * elem_bytes) == 0:
            return v
        v //= 2
    return 1


def store_runs(cg: CodeGen, x: DTile, coords: list[list[LLValue]], vec: int, address: Any, sty: str,
               elem_bytes: int) -> None:
    """Store ``x`` in runs of ``vec`` registers: ``address(coords)`` is the shared-memory pointer of
    an element; a replicated run (the same elements as one already stored) is stored once."""
    fb = cg.fb
    total, word, nwords = run_words(vec, elem_bytes)
    seen: set[tuple[str, ...]] = set()
    for start in range(0, len(x.regs), vec):
        key = tuple(c.ref for c in coords[start])
        if key in seen:
            continue
        seen.add(key)
        ptr = address(coords[start])
        if vec == 1:
            v = x.regs[start]
            if v.type == "i1":
                v = fb.cast("zext", v, "i8")
            fb.emit(f"store {sty} {v.ref}, ptr addrspace(3) {ptr.ref}, align {elem_bytes}")
            continue
        words = pack_words(cg, x.regs[start:start + vec], elem_bytes, word)
        if nwords == 1:
            fb.emit(f"store i{8 * word} {words[0].ref}, ptr addrspace(3) {ptr.ref}, align {total}")
            continue
        vty = f"<{nwords} x i{8 * word}>"
        packed = LLValue("poison", vty)
        for i, w in enumerate(words):
            packed = fb.insert_element(packed, w, i)
        fb.emit(f"store {vty} {packed.ref}, ptr addrspace(3) {ptr.ref}, align {total}")


def load_runs(cg: CodeGen, coords: list[list[LLValue]], vec: int, address: Any, sty: str,
              elem_bytes: int) -> list[LLValue]:
    """Registers of a tile loaded in runs of ``vec`` (as :func:`store_runs` stores them):
    ``address(coords)`` is the shared-memory pointer of an element; a replicated run (the same
    elements as one already loaded) is loaded once and its values reused."""
    fb = cg.fb
    total, word, nwords = run_words(vec, elem_bytes)
    regs: list[LLValue] = []
    loaded: dict[tuple[str, ...], list[LLValue]] = {}
    for start in range(0, len(coords), vec):
        key = tuple(c.ref for c in coords[start])
        values = loaded.get(key)
        if values is None:
            ptr = address(coords[start])
            if vec == 1:
                values = [fb.value(f"load {sty}, ptr addrspace(3) {ptr.ref}, align {elem_bytes}", sty, "ls")]
            else:
                wty = f"i{8 * word}"
                if nwords == 1:
                    words = [fb.value(f"load {wty}, ptr addrspace(3) {ptr.ref}, align {total}", wty, "ls")]
                else:
                    vty = f"<{nwords} x {wty}>"
                    raw = fb.value(f"load {vty}, ptr addrspace(3) {ptr.ref}, align {total}", vty, "ls")
                    words = [fb.extract_element(raw, i, wty) for i in range(nwords)]
                values = unpack_words(cg, words, elem_bytes, word, sty)
            loaded[key] = values
        regs.extend(values)
    return regs
