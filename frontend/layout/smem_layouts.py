"""Named shared-memory (SMEM) layouts: the hardware swizzle of a byte address (PTX ISA §5.5.7;
``docs/hardware.md`` §5.3), tiles as TMA writes them, the no-swizzle core-matrix layouts and
CuTe-style strided layouts (PTX §9.7.16.3.3, §9.7.15.5.1.2), each as an ``offset`` -> logical
:class:`~sparsile.frontend.layout.layouts.LinearLayout`.
"""

from __future__ import annotations

from collections.abc import Sequence

from .gf2 import LayoutError, log2_exact, padded_shape
from .hardware_dims import OFFSET
from .layouts import LinearLayout

SWIZZLE_BYTES = {"none": 0, "32B": 32, "64B": 64, "128B": 128}


def swizzle_name(swizzle: str | int | None) -> str:
    """Normalize ``"none"/None/0``, ``"32B"/32``, ``"64B"/64``, ``"128B"/128``."""
    if swizzle in (None, 0, 16, "none", "None"):
        return "none"
    for name, nbytes in SWIZZLE_BYTES.items():
        if swizzle in (name, nbytes, name.lower()):
            return name
    raise LayoutError("SP0406", f"unknown shared-memory swizzle {swizzle!r}",
                      help="use 'none', '32B', '64B' or '128B'")


def swizzle_address(byte_address: int, swizzle: str | int | None) -> int:
    """The hardware swizzle of a byte address (PTX ISA §5.5.7 tables; docs/hardware.md §5.3 [H]).

    The 16-byte chunk index (address bits 4..) is XORed with the 128-byte line index (bits 7..):
    ``bits[4, 4+s) ^= bits[7, 7+s)`` with s = 1, 2, 3 for 32B, 64B, 128B (CuTe Swizzle<s,4,3>).
    For 128B this is "chunk j of row r lands at j ^ (r % 8)" with 128-byte rows; for 64B and 32B
    the XOR uses the *128-byte line*, so 64-byte rows r and r+1 share a pattern.  The pattern
    repeats every 256/512/1024 bytes; bases must be aligned to that for base offset 0.
    """
    nbytes = SWIZZLE_BYTES[swizzle_name(swizzle)]
    if not nbytes:
        return byte_address
    s = log2_exact(nbytes // 16)
    return byte_address ^ (((byte_address >> 7) & ((1 << s) - 1)) << 4)


def smem_from_address_map(dims: Sequence[tuple[str, int]], bit_address_of_basis: dict[str, list[int]],
                           elem_bits: int, swizzle: str | int | None) -> LinearLayout:
    """Invert a logical -> (swizzled) address map into an ``offset -> logical`` layout."""
    ebits = log2_exact(elem_bits, "element bits")
    nbytes = SWIZZLE_BYTES[swizzle_name(swizzle)]
    mask = (nbytes // 16) - 1 if nbytes else 0
    cols = []
    for name, _ in dims:
        for addr_bits in bit_address_of_basis[name]:
            # swizzle_address on the byte part of a bit address (linear over GF(2))
            addr_bits ^= ((addr_bits >> 10) & mask) << 7
            cols.append(addr_bits >> ebits)
    total = 1
    for _, s in dims:
        total *= s
    logical_to_offset = LinearLayout._from_columns(tuple(dims), ((OFFSET, total),), cols)
    return logical_to_offset.invert()


def smem_tile(rows: int, cols: int, elem_bits: int, swizzle: str | int | None = "128B",
              dims: tuple[str, str] = ("m", "k")) -> LinearLayout:
    """A 2-D tile as TMA writes it: ``offset`` (elements) to ``(dims[0], rows), (dims[1], cols)``.

    ``dims[1]`` is contiguous.  With a swizzle of ``S`` bytes a row holds at most ``S`` bytes: a
    wider tile is stored as column panels of ``S`` bytes, each panel holding all rows (one TMA box
    per panel), panels one after another.  The swizzle is then applied to byte addresses
    (:func:`swizzle_address`).  Without swizzle the tile is plain row-major.  This is the K-major
    (dims = (mn, k)) or MN-major (dims = (k, mn)) operand tile of PTX §9.7.16.10.6 / §9.7.15.5.1.2
    when rows are packed (row pitch = min(row bytes, S)).
    """
    name = swizzle_name(swizzle)
    span = SWIZZLE_BYTES[name]
    rows_p, cols_p = padded_shape((rows, cols))
    row_bits = cols_p * elem_bits
    if name == "none":
        pitch_bits = row_bits
        panel_cols = cols_p
    else:
        pitch_bits = min(row_bits, span * 8)
        panel_cols = pitch_bits // elem_bits
        if pitch_bits < 128:
            raise LayoutError("SP0406", "a swizzled row must hold at least 16 bytes, "
                              f"found {pitch_bits // 8}")
    addr: dict[str, list[int]] = {dims[0]: [], dims[1]: []}
    for b in range(log2_exact(cols_p)):
        c = 1 << b
        if c < panel_cols:
            addr[dims[1]].append(c * elem_bits)
        else:
            addr[dims[1]].append((c // panel_cols) * rows_p * pitch_bits)
    for b in range(log2_exact(rows_p)):
        addr[dims[0]].append((1 << b) * pitch_bits)
    return smem_from_address_map([(dims[0], rows_p), (dims[1], cols_p)], addr, elem_bits, name)


def smem_core_matrices(rows: int, cols: int, elem_bits: int, *, k_major: bool = True,
                       k_groups_adjacent: bool = True, dims: tuple[str, str] = ("m", "k")) -> LinearLayout:
    """The no-swizzle ("interleaved") canonical layout of PTX §9.7.16.3.3 / §9.7.15.5.1.2.1.3.

    Core matrices are 8 rows × 16 bytes, stored contiguously (128 B).  ``dims`` are (MN, K).
    K-major: a core-matrix row runs along K; MN-major: along MN.  ``k_groups_adjacent`` chooses
    the arrangement of core matrices: K-direction neighbours adjacent (the H200-verified choice of
    docs/hardware.md §4.2, LBO = 128 B) or MN-direction neighbours adjacent (CUTLASS, §9).
    """
    mn_name, k_name = dims
    mn, k = padded_shape((rows, cols))
    t = 128 // elem_bits  # elements per 16 bytes
    contig, strided = (k, mn) if k_major else (mn, k)
    if contig < t or strided < 8:
        raise LayoutError("SP0406", f"core matrices need at least {t} contiguous elements and 8 rows")
    n_contig_groups = contig // t
    n_strided_groups = strided // 8
    addr_contig = [(1 << b) * elem_bits for b in range(log2_exact(t))]
    addr_strided = [(1 << b) * 128 for b in range(3)]
    # core-matrix grid: index (contig group, strided group)
    k_groups = n_contig_groups if k_major else n_strided_groups
    mn_groups = n_strided_groups if k_major else n_contig_groups
    k_step, mn_step = (1024, 1024 * k_groups) if k_groups_adjacent else (1024 * mn_groups, 1024)
    contig_step = k_step if k_major else mn_step
    strided_step = mn_step if k_major else k_step
    addr_contig += [(1 << b) * contig_step for b in range(log2_exact(n_contig_groups))]
    addr_strided += [(1 << b) * strided_step for b in range(log2_exact(n_strided_groups))]
    if k_major:
        addr = {k_name: addr_contig, mn_name: addr_strided}
    else:
        addr = {mn_name: addr_contig, k_name: addr_strided}
    return smem_from_address_map([(mn_name, mn), (k_name, k)], addr, elem_bits, "none")


def smem_from_strides(dims: Sequence[tuple[str, Sequence[tuple[int, int]]]], elem_bits: int,
                      swizzle: str | int | None = "none") -> LinearLayout:
    """A SMEM layout from CuTe-style ``(size, stride)`` modes per logical dim (strides in elements,
    powers of two), optionally composed with a hardware swizzle: ``Swizzle o layout`` as written
    in PTX §9.7.16.3.3.  Modes of one dim are listed minor first."""
    addr: dict[str, list[int]] = {}
    out = []
    for name, modes in dims:
        bits = []
        extent = 1
        for size, stride in modes:
            for b in range(log2_exact(size, f"mode size of {name!r}")):
                bits.append((1 << b) * stride * elem_bits)
            extent *= size
        addr[name] = bits
        out.append((name, extent))
    for name, _ in out:
        for a in addr[name]:
            if a and a & (a - 1):
                raise LayoutError("SP0401", f"stride of {name!r} is not a power of two")
    return smem_from_address_map(out, addr, elem_bits, swizzle)


__all__ = ["SWIZZLE_BYTES", "smem_core_matrices", "smem_from_address_map", "smem_from_strides", "smem_tile",
           "swizzle_address", "swizzle_name"]
