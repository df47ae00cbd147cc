"""The one exception of the sparsity toolkit and its SP08xx codes.

Every mistake a user can make with sparse data (a matrix that is not 2:4, metadata in the wrong
format, for the wrong operand width, of the wrong shape, with an undefined nibble) raises a
:class:`SparsityError`. It is a :class:`ValueError`, carries the diagnostic ``code`` and a ``help``
line naming the fix, and renders like the compiler's launch errors
(``error[SP0803]: ...`` followed by ``= help: ...``).
"""

from __future__ import annotations

from ...frontend.diagnostics import SparsileError

SP_UNKNOWN_DTYPE = "SP0801"
"""An operand dtype name that is not one of f16, bf16, tf32/f32, e4m3, e5m2, s8, u8, e2m1."""
SP_UNKNOWN_FORMAT = "SP0802"
"""A metadata format name that is not "tcgen05", "sm90" or "logical"."""
SP_NOT_SPARSE = "SP0803"
"""A dense matrix handed to ``compress`` breaks the N:M pattern of its operand type."""
SP_BAD_INPUT = "SP0804"
"""An input array of the wrong rank, element type or axis, one that cannot be read on the host, or a
size (m, k, a row) that is not a non-negative integer."""
SP_META_SHAPE = "SP0805"
"""A metadata buffer whose shape differs from the one its format, operand type, m and k require;
logical indices not of shape (M, K/G, S), from every entry point that reads them."""
SP_META_ELEMENT_TYPE = "SP0806"
"""A metadata buffer of the wrong element type (hardware formats are uint32 words, logical indices
integers), from every entry point that reads logical indices (encode, validate, decode, decompress)."""
SP_UNDEFINED_NIBBLE = "SP0807"
"""A metadata nibble the PTX ISA leaves undefined (0x0, 0x5, 0xA, 0xF; for tf32 anything but 0x4/0xE),
or a pair of logical indices naming one position twice (the nibble it would encode to)."""
SP_UNORDERED_PAIR = "SP0808"
"""A metadata nibble or a pair of logical indices whose two indices are not increasing where the
consumer needs order (encode_metadata always does)."""
SP_WRONG_WIDTH = "SP0809"
"""Metadata formatted for one operand width (16-bit, tf32, 8-bit, 4-bit) used with another."""
SP_WRONG_FORMAT = "SP0810"
"""Metadata in one format ("sm90") used where another ("tcgen05") is expected."""
SP_FORMAT_UNSUPPORTED = "SP0811"
"""A format that does not exist for an operand type (4-bit operands have no sm90 format)."""
SP_MISSING_SIZE = "SP0812"
"""A raw metadata array given without m, k and dtype, or with sizes that contradict its tag."""
SP_BAD_INDICES = "SP0813"
"""A logical index out of its chunk's range (the other faults of logical indices have the codes of
the metadata faults they are: SP0805 shape, SP0806 element type, SP0807 equal pair, SP0808
decreasing pair)."""
SP_VALUES_MISMATCH = "SP0814"
"""A values array whose shape or element type does not match its metadata."""
SP_OPERAND_MISMATCH = "SP0815"
"""The dense B operand of the reference matmul does not have K rows."""
SP_VIZ_UNAVAILABLE = "SP0816"
"""A picture was asked for as PNG/SVG but matplotlib is not installed."""
SP_VIZ_BAD_REQUEST = "SP0817"
"""A picture request with an unknown file suffix or an empty placement."""

ALL_CODES: dict[str, str] = {
    code: name
    for name, code in dict(globals()).items()
    if name.startswith("SP_") and isinstance(code, str)
}
"""Every SP08xx code of this package, mapped to the constant's name (for docs and tests)."""


class SparsityError(SparsileError, ValueError):
    """A user-facing error about sparse data: ``code`` (SP08xx), ``message`` and ``help``.

    ``str()`` gives ``error[CODE]: message`` and, when there is one, a ``= help: ...`` line, in the
    same shape as :class:`sparsile.frontend.diagnostics.LaunchError` (both are a
    :class:`~sparsile.frontend.diagnostics.SparsileError`).
    """
