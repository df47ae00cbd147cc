"""Where each logical (row, chunk) nibble sits in hardware, as explicit per-cell maps.

These maps are written directly from the formulas of docs/hardware.md §1.4 and §4.2, one cell
at a time, independently of the vectorized encoders in :mod:`.layouts`; the tests check that the
two agree, and :mod:`sparsile.stdlib.viz` draws them.

Coordinates are (y, x) with x counting nibble slots: x = 8·word_column + slot, so that a row of
the picture reads like the bits of consecutive 32-bit words.
"""

from __future__ import annotations

from .dtypes import OperandType, operand_type
from .errors import SP_BAD_INPUT, SparsityError
from .hostarray import checked_size
from .layouts import NIBBLES_PER_WORD, TMEM_LANES, check_format, check_supported, word_position

Cells = dict[tuple[int, int], tuple[int, int]]
"""(y, x) hardware position -> (row, chunk) of the logical operand."""
MAX_CELLS = 1 << 22
"""The most nibbles a placement map enumerates (one Python dict entry each; maps are for pictures)."""


def _cell_count(op: OperandType, m: int, k: int) -> tuple[int, int]:
    """(m, chunks) of an (m, k) operand, checked: sizes are non-negative ints and the map stays
    within :data:`MAX_CELLS` (a larger one would take minutes and gigabytes to build)."""
    m, k = checked_size(m, "m"), checked_size(k, "k")
    chunks = -(-k // op.group)
    if m * chunks > MAX_CELLS:
        raise SparsityError(SP_BAD_INPUT, f"a placement map of an ({m}, {k}) operand has {m * chunks} cells; "
                            f"the limit is {MAX_CELLS}", help="draw a corner of the operand (a few tiles) instead")
    return m, chunks


def hardware_placement(fmt: str, dtype: str | OperandType, m: int, k: int) -> Cells:
    """Memory placement of every real (non-padding) nibble of an (m, k) operand.

    "tcgen05": y = TMEM lane (128·M-tile + lane), x = 8·column + slot (column = 4·K-atom + column
    in the atom). "sm90": y = word row L of the global array, x = 8·word column + slot.
    "logical": y = row, x = chunk.
    """
    fmt = check_format(fmt)
    op = operand_type(dtype)
    check_supported(fmt, op)
    m, chunks = _cell_count(op, m, k)
    cells: Cells = {}
    for row in range(m):
        for chunk in range(chunks):
            if fmt == "logical":
                cells[(row, chunk)] = (row, chunk)
                continue
            index, slot = word_position(fmt, op, row, chunk)
            if fmt == "sm90":
                y, column = index
            else:
                katom, matom, lane, col = index
                y, column = TMEM_LANES * matom + lane, 4 * katom + col
            cells[(y, NIBBLES_PER_WORD * column + slot)] = (row, chunk)
    return cells


def sm90_thread_slot(op: OperandType, row: int, chunk: int, spsel: int = 0) -> tuple[int, int, int]:
    """(thread of its warpgroup, instruction k-step, nibble slot) that supplies the nibble of
    (row, chunk) to ``wgmma.mma_async.sp`` (docs/hardware.md §4.2); the warpgroup covers rows
    64·(row // 64) ...

    16-bit/tf32: warp w = r//16, lane 4g+t with g = r%8 and t = 2·spsel + h, where h = (chunk//4)%2
    is the instruction half; the register's bits [15:0] are row 16w+g and [31:16] row 16w+g+8.
    8-bit (spsel 0): thread (g, t) of warp w holds row 16w+g+8(t%2), word 2·kstep + t//2.
    """
    r = row % 64
    w, g = r // 16, r % 8
    upper = (r // 8) % 2
    if op.interleaved:
        kstep, rest = divmod(chunk, NIBBLES_PER_WORD)
        half, j = divmod(rest, 4)
        t = 2 * spsel + half
        slot = 4 * upper + j
    else:
        word, slot = divmod(chunk, NIBBLES_PER_WORD)
        kstep, pair = divmod(word, 2)
        t = 2 * pair + upper
    return 32 * w + 4 * g + t, kstep, slot


def thread_placement(dtype: str | OperandType, m: int, k: int, spsel: int = 0) -> Cells:
    """Register placement of the "sm90" metadata: y = 128·(row // 64) + thread of the warpgroup,
    x = 8·k-step + nibble slot of that thread's metadata register (one register per instruction).
    For 16-bit and tf32 only the thread pair chosen by ``spsel`` holds metadata."""
    op = operand_type(dtype)
    check_supported("sm90", op)
    m, chunks = _cell_count(op, m, k)
    cells: Cells = {}
    for row in range(m):
        for chunk in range(chunks):
            thread, kstep, slot = sm90_thread_slot(op, row, chunk, spsel)
            cells[(128 * (row // 64) + thread, NIBBLES_PER_WORD * kstep + slot)] = (row, chunk)
    return cells
