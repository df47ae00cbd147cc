"""Descriptor encoders, decoders and their legality rules, as pure functions on ints: the public
face of the descriptor modules of ``target/``, which re-exports them (``from
sparsile.target.descriptors import ...`` is how tests and docs/diagnostics.md reach them).

* tcgen05 instruction descriptor (``docs/hardware.md`` §1.3), plain kinds f16/tf32/f8f6f4/i8
  and block-scaled kinds mxf8f6f4/mxf4/mxf4nvf4, with the §1.2 shape table and §9 precisions
  (``idesc.py``).
* tcgen05 shared-memory matrix descriptor (§1.5, §9) and sm90 wgmma shared-memory descriptor
  (§4.3) (``smem_desc.py``).
* the wgmma instruction rules (§4.1) (``wgmma_rules.py``).
* :class:`Problem` and the bit-field helpers the three share (``descriptor_fields.py``).

ptxas does not check any of these (§0 item 1): a bad descriptor is a silent runtime failure.
So every rule lives here once, as data: ``*_problems(...)`` returns :class:`Problem` values with
user-grade messages that the legality pass turns into diagnostics, and the ``encode_*`` builders
raise :class:`InternalError` if called with a descriptor that has problems (legality should have
reported them first).

Problem codes (SP05xx): 0501 unknown name, 0502 operand type, 0503 accumulator type, 0504 M,
0505 N, 0506 MN-major, 0507 negate, 0508 sparsity selector, 0509 saturate, 0510 max shift,
0511 cta_group, 0512 sparse M=64, 0513 block-scale fields; 0520 alignment, 0521 field range,
0522 swizzle, 0523 base offset / LBO mode; 0530 wgmma types, 0531 wgmma accumulator, 0532 wgmma
N, 0533 wgmma sparsity selector, 0534 wgmma transpose.
"""

from __future__ import annotations

from .descriptor_fields import Problem
from .idesc import (
    BLOCK_SCALED_KINDS,
    D_TYPE_CODES,
    DTYPES,
    KINDS,
    MAJORS,
    MAX_SHIFT_CODES,
    MN_MAJOR_TYPES,
    PLAIN_KINDS,
    SCALE_TYPE_CODES,
    TYPE_CODES,
    InstrDesc,
    decode_idesc,
    describe_idesc,
    encode_idesc,
    idesc_problems,
    pack_idesc,
    tcgen05_k,
)
from .smem_desc import (
    SMEM_ADDRESS_MASK,
    SWIZZLE_REPEAT_BYTES,
    TCGEN05_SWIZZLE_CODES,
    WGMMA_SWIZZLE_CODES,
    SmemDesc,
    decode_tcgen05_smem_desc,
    decode_wgmma_desc,
    encode_tcgen05_smem_desc,
    encode_wgmma_desc,
    swizzle_base_offset,
    tcgen05_smem_desc_problems,
    wgmma_desc_problems,
)
from .wgmma_rules import WGMMA_DTYPES, WGMMA_INT_N, wgmma_k, wgmma_problems

__all__ = [
    "BLOCK_SCALED_KINDS", "DTYPES", "D_TYPE_CODES", "KINDS", "MAJORS", "MAX_SHIFT_CODES", "MN_MAJOR_TYPES",
    "PLAIN_KINDS", "SCALE_TYPE_CODES", "SMEM_ADDRESS_MASK", "SWIZZLE_REPEAT_BYTES", "TCGEN05_SWIZZLE_CODES",
    "TYPE_CODES", "WGMMA_DTYPES", "WGMMA_INT_N", "WGMMA_SWIZZLE_CODES", "InstrDesc", "Problem", "SmemDesc",
    "decode_idesc", "decode_tcgen05_smem_desc", "decode_wgmma_desc", "describe_idesc", "encode_idesc",
    "encode_tcgen05_smem_desc", "encode_wgmma_desc", "idesc_problems", "pack_idesc", "swizzle_base_offset",
    "tcgen05_k", "tcgen05_smem_desc_problems", "wgmma_desc_problems", "wgmma_k", "wgmma_problems",
]
