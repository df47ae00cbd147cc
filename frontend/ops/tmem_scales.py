"""Block scale factors in tensor memory for ``tcgen05.mma(..., a_scale=, b_scale=)`` (kind::mxf8f6f4
``.block_scale``, ``scale_vec::1X``; PTX ISA 9.7.16.10.7, docs/hardware.md §1.1-1.3).

One place for the rules the typing (``ops_blackwell.mma``), the interpreter and the lowering
(``backend/lower/blackwell_mma.mma_plan``) share:

* **Block.** Every instruction uses one UE8M0 scale per row of A and per row of B (B stored N x K):
  the block is the instruction's K — 32 dense, 64 logical K sparse (``stdlib/blockscale.py``).
  K step ``ks`` of a call uses block ``ks``.
* **TMEM image** (a ``kind="scale"`` region of u32 words, filled by ``tcgen05.copy`` from atoms of
  the "tcgen05" scale format with ``tcgen05.cp.32x128b.warpx4``): scale (row ``m``, block ``j``) of
  an operand with ``R`` rows is byte ``j % 4`` of column ``(j // 4)·group + (m // 128)·4 + (m % 128)
  // 32``, lanes ``m % 32 + 32q`` for every lane quarter q (the copy duplicates it; PTX ISA
  9.7.16.10.7 asks for the duplication), ``group = 4·ceil(R / 128)`` columns per 4 blocks.
* **Instruction operands.** The instruction of K step ``ks``, M tile ``mt``, N tile ``n0`` gets
  scale-factor ids ``ks % 4`` (idesc bits 29-30 A, 4-5 B: the byte of the word) and the TMEM
  column addresses ``(ks // 4)·group_A + 4·mt`` and ``(ks // 4)·group_B + n0 // 32``; the hardware
  adds ``(row % 128) // 32`` (A) or ``(n - n0) // 32`` (B) itself. Derived from the PTX figures and
  CUTLASS's conventions, not run (docs/blackwell.md §8).
"""

from __future__ import annotations

import numpy as np

SCALE_ATOM_LINES = 32
"""Shared-memory lines (16 bytes each) of one scale atom: 128 rows x 4 blocks of UE8M0 bytes."""
SCALE_ATOM_COLUMNS = 4
"""TMEM columns one scale atom fills (``tcgen05.cp.32x128b.warpx4``: 128 bits per lane)."""
BLOCKS_PER_WORD = 4


def group_columns(rows: int) -> int:
    """TMEM columns holding 4 blocks of scales for ``rows`` rows (one atom per 128 rows)."""
    return SCALE_ATOM_COLUMNS * (-(-rows // 128))


def scale_columns_needed(rows: int, k_steps: int) -> int:
    """Columns a scale view must have for ``k_steps`` instructions (one block each) over ``rows``."""
    return group_columns(rows) * (-(-k_steps // BLOCKS_PER_WORD))


def a_scale_column(ks: int, m_tile: int, m: int) -> int:
    """TMEM column (relative to the A scale view) of the instruction of K step ``ks``, M tile."""
    return (ks // BLOCKS_PER_WORD) * group_columns(m) + SCALE_ATOM_COLUMNS * m_tile


def b_scale_column(ks: int, n0: int, n: int) -> int:
    """TMEM column (relative to the B scale view) of the instruction of K step ``ks``, N tile at n0."""
    return (ks // BLOCKS_PER_WORD) * group_columns(n) + n0 // 32


def scale_id(ks: int) -> int:
    """The scale-factor id (byte of the 32-bit TMEM word) of K step ``ks`` (A and B alike)."""
    return ks % BLOCKS_PER_WORD


def read_scales(view: np.ndarray, rows: int, k_steps: int, what: str) -> np.ndarray:
    """The (rows, k_steps) UE8M0 bytes an MMA reads from a scale view (u32 words, 128 lanes), each
    from the lanes of its own quarter; ``ValueError`` if the four lane quarters disagree on a byte
    the MMA reads (the scales were not duplicated into every quarter)."""
    words = np.asarray(view).astype(np.uint32)
    out = np.zeros((rows, k_steps), np.uint8)
    g = group_columns(rows)
    for ks in range(k_steps):
        base = (ks // BLOCKS_PER_WORD) * g
        shift = np.uint32(8 * scale_id(ks))
        for m in range(rows):
            col = base + (m // 128) * SCALE_ATOM_COLUMNS + (m % 128) // 32
            lanes = words[(m % 32)::32, col][:4]
            vals = (lanes >> shift) & np.uint32(0xFF)
            if (vals != vals[0]).any():
                raise ValueError(f"the {what} scale of row {m}, block {ks} differs between the TMEM lane quarters "
                                 f"(lanes {m % 32}, {m % 32 + 32}, {m % 32 + 64}, {m % 32 + 96} of column {col} hold "
                                 f"{[int(v) for v in vals]}): tcgen05.mma reads scale factors duplicated into "
                                 "every 32-lane quarter (copy them with tcgen05.copy)")
            out[m, ks] = vals[(m % 128) // 32]
    return out


def apply_scales(x: np.ndarray, scales: np.ndarray, block: int) -> np.ndarray:
    """``x`` (rows, K) as float64 times ``2^(scale - 127)`` per block of ``block`` K elements
    (UE8M0 0xFF is NaN)."""
    s = scales.astype(np.int64)
    factor = np.where(s == 0xFF, np.nan, np.ldexp(1.0, s - 127))
    return x.astype(np.float64) * np.repeat(factor, block, axis=1)[:, :x.shape[1]]
