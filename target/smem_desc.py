"""Shared-memory matrix descriptors, as pure functions on ints: the tcgen05 descriptor
(``docs/hardware.md`` §1.5, §9) and the sm90 wgmma descriptor (§4.3), with their rules (codes
SP0520-SP0523: alignment, field range, swizzle, base offset / LBO mode) and the base offset of a
swizzle pattern.
"""

from __future__ import annotations

from dataclasses import dataclass

from .descriptor_fields import Problem, code_name, field_bits, join_values, pack_fields, raise_if_problems

TCGEN05_SWIZZLE_CODES = {"none": 0, "128B_base32B": 1, "128B": 2, "64B": 4, "32B": 6}
WGMMA_SWIZZLE_CODES = {"none": 0, "128B": 1, "64B": 2, "32B": 3}
SWIZZLE_REPEAT_BYTES = {"none": 0, "128B_base32B": 1024, "128B": 1024, "64B": 512, "32B": 256}
SMEM_ADDRESS_MASK = 0x3FFFF
"""The descriptor addresses shared memory with 18 bits (14-bit field of ``address >> 4``)."""
_TCGEN05_VERSION_BIT = 1 << 46


@dataclass(frozen=True)
class SmemDesc:
    """A shared-memory matrix descriptor: byte ``start_address``, leading-dimension and stride
    byte offsets (``lbo``/``sbo``, meaning per major and swizzle in §1.5 / §9), ``swizzle``
    name, ``base_offset`` (0..7) and, for tcgen05 only, ``lbo_mode`` (bit 52)."""

    start_address: int
    lbo: int
    sbo: int
    swizzle: str = "none"
    base_offset: int = 0
    lbo_mode: int = 0


def _common_smem_problems(d: SmemDesc, swizzles: dict[str, int]) -> list[Problem]:
    out = []
    for fld in ("start_address", "lbo", "sbo"):
        value = getattr(d, fld)
        if not isinstance(value, int) or value < 0 or value % 16:
            out.append(Problem("SP0520", f"{fld.replace('_', ' ')} {value} is not 16-byte aligned",
                               "descriptor addresses and byte offsets must be multiples of 16", fld))
        elif value > SMEM_ADDRESS_MASK:
            out.append(Problem("SP0521", f"{fld.replace('_', ' ')} {value} does not fit the 14-bit "
                               "descriptor field", f"keep it below {SMEM_ADDRESS_MASK + 1} bytes", fld))
    if d.swizzle not in swizzles:
        out.append(Problem("SP0522", f"swizzle `{d.swizzle}` has no descriptor encoding",
                           f"use one of: {join_values(swizzles)}", "swizzle"))
    if not 0 <= d.base_offset <= 7:
        out.append(Problem("SP0523", f"base offset {d.base_offset} does not fit 3 bits", "use 0..7",
                           "base_offset"))
    return out


def tcgen05_smem_desc_problems(d: SmemDesc, *, major: str | None = None) -> list[Problem]:
    """Rules of §1.5: 16-byte alignment, 14-bit fields, swizzle codes (3/5/7 invalid),
    ``128B_base32B`` only for MN-major operands, base offset 0..7, and LBO mode 0 (the
    absolute-address mode is sm_103a-only and not used by sparsile)."""
    out = _common_smem_problems(d, TCGEN05_SWIZZLE_CODES)
    if d.swizzle == "128B_base32B" and major == "K":
        out.append(Problem("SP0522", "the 128B swizzle with 32-byte atoms is only for MN-major operands",
                           "use the 128B swizzle for a K-major operand", "swizzle"))
    if d.lbo_mode != 0:
        out.append(Problem("SP0523", f"LBO mode {d.lbo_mode} (absolute leading-dimension address) is not "
                           "supported", "use LBO mode 0 (relative byte offset)", "lbo_mode"))
    return out


def wgmma_desc_problems(d: SmemDesc) -> list[Problem]:
    """Rules of §4.3 (same fields as tcgen05 without version bit and LBO mode; 2-bit swizzle)."""
    out = _common_smem_problems(d, WGMMA_SWIZZLE_CODES)
    if d.lbo_mode != 0:
        out.append(Problem("SP0523", "the wgmma descriptor has no LBO mode", "use LBO mode 0", "lbo_mode"))
    return out


def _pack_smem_common(d: SmemDesc) -> list[tuple[int, int, int]]:
    """Bits 0-13 address>>4, 16-29 LBO>>4, 32-45 SBO>>4, 49-51 base offset (§1.5 = §4.3)."""
    return [((d.start_address & SMEM_ADDRESS_MASK) >> 4, 0, 14), (d.lbo >> 4, 16, 14), (d.sbo >> 4, 32, 14),
            (d.base_offset, 49, 3)]


def encode_tcgen05_smem_desc(d: SmemDesc, *, major: str | None = None) -> int:
    """The 64-bit tcgen05 shared-memory descriptor (§1.5): common fields, bit 46 set (the
    constant 0b001 at 46-48), LBO mode at 52, swizzle code at 61-63."""
    raise_if_problems(tcgen05_smem_desc_problems(d, major=major), "tcgen05 shared-memory descriptor")
    return (pack_fields([*_pack_smem_common(d), (d.lbo_mode, 52, 1), (TCGEN05_SWIZZLE_CODES[d.swizzle], 61, 3)])
            | _TCGEN05_VERSION_BIT)


def encode_wgmma_desc(d: SmemDesc) -> int:
    """The 64-bit sm90 wgmma descriptor (§4.3): common fields and swizzle code at 62-63."""
    raise_if_problems(wgmma_desc_problems(d), "wgmma shared-memory descriptor")
    return pack_fields([*_pack_smem_common(d), (WGMMA_SWIZZLE_CODES[d.swizzle], 62, 2)])


def _decode_smem_common(word: int, reserved_mask: int, what: str) -> dict[str, int]:
    if not 0 <= word < (1 << 64):
        raise ValueError(f"{what} {word:#x} does not fit 64 bits")
    if word & reserved_mask:
        raise ValueError(f"reserved bits set in {what} {word:#018x}")
    return dict(start_address=field_bits(word, 0, 14) << 4, lbo=field_bits(word, 16, 14) << 4,
                sbo=field_bits(word, 32, 14) << 4, base_offset=field_bits(word, 49, 3))


def decode_tcgen05_smem_desc(word: int) -> SmemDesc:
    """Inverse of :func:`encode_tcgen05_smem_desc`; ``ValueError`` if bit 46 is clear, reserved
    bits are set or the swizzle code is 3, 5 or 7."""
    reserved = (0b11 << 14) | (0b11 << 30) | (0b11 << 47) | (0xFF << 53)
    fields = _decode_smem_common(word, reserved, "tcgen05 shared-memory descriptor")
    if not word & _TCGEN05_VERSION_BIT:
        raise ValueError(f"tcgen05 shared-memory descriptor {word:#018x} lacks the version bit 46")
    swizzle = code_name(TCGEN05_SWIZZLE_CODES, field_bits(word, 61, 3), "tcgen05 swizzle")
    return SmemDesc(**fields, swizzle=swizzle, lbo_mode=field_bits(word, 52, 1))


def decode_wgmma_desc(word: int) -> SmemDesc:
    """Inverse of :func:`encode_wgmma_desc`; ``ValueError`` if reserved bits are set."""
    reserved = (0b11 << 14) | (0b11 << 30) | (0b111 << 46) | (0x3FF << 52)
    fields = _decode_smem_common(word, reserved, "wgmma shared-memory descriptor")
    return SmemDesc(**fields, swizzle=code_name(WGMMA_SWIZZLE_CODES, field_bits(word, 62, 2), "wgmma swizzle"))


def swizzle_base_offset(address: int, swizzle: str) -> int:
    """The base-offset field for a swizzle pattern that starts at ``address`` (§1.5): 0 when the
    pattern starts on its repeat boundary (1024 / 512 / 256 B for 128 / 64 / 32 B swizzles),
    else ``(address >> 7) & 7``. Advancing K inside an atom by adding to the address field
    keeps base offset 0 (§1.5), so this is for the start of a pattern only."""
    repeat = SWIZZLE_REPEAT_BYTES[swizzle]
    if repeat == 0 or address % repeat == 0:
        return 0
    return (address >> 7) & 7
